//! The read access classifiers are written against, and the JSON types.

use std::borrow::Cow;

/// The JSON type of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonKind {
    /// `null`
    Null,
    /// `true` / `false`
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

/// Read access to a parsed JSON value, as much as classifiers need.
pub(crate) trait JsonView<'a>: Copy + Sized {
    /// The value's type.
    fn kind(self) -> JsonKind;
    /// The values of `keys` when this is an object (last duplicate wins, as in
    /// `serde_json::Value`); all `None` otherwise.
    fn fields<const N: usize>(self, keys: [&str; N]) -> [Option<Self>; N];
    /// Calls `f` on each element when this is an array.
    fn for_each(self, f: impl FnMut(Self));
    /// Whether this is a string equal to `s` (after unescaping).
    fn str_eq(self, s: &str) -> bool;
    /// The unescaped string, when this is a string.
    fn text(self) -> Option<Cow<'a, str>>;
    /// The value as an unsigned integer, as `Value::as_u64` reads it.
    fn as_u64(self) -> Option<u64>;
    /// The value as a boolean.
    fn as_bool(self) -> Option<bool>;
    /// Whether this is a non-empty string, array or object.
    fn is_nonempty(self) -> bool;
    /// One field of an object.
    fn get(self, key: &str) -> Option<Self> {
        let [v] = self.fields([key]);
        v
    }
    /// Whether this is a string that is not empty.
    fn is_nonempty_str(self) -> bool {
        self.kind() == JsonKind::String && self.is_nonempty()
    }
    /// Whether this is `null`.
    fn is_null(self) -> bool {
        self.kind() == JsonKind::Null
    }
}
