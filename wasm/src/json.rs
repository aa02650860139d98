//! Events, reports and outcomes as JSON text, written by their `Serialize`
//! impls: the text `serde_json::to_string` gives (field names and order,
//! tags, `null` for `None`, unit variants as strings), which the JS shell
//! reads with one `JSON.parse`. Integers and strings only (none of these
//! types holds a float): no serde_json, no float or `core::fmt` number
//! formatting in the module.

use std::fmt;

use serde::Serialize;
use serde::ser;

/// `value` as JSON text; `null` when it cannot be represented (never for
/// the engine's types).
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Json(String::new());
    match value.serialize(&mut out) {
        Ok(()) => out.0,
        Err(Error) => String::from("null"),
    }
}

/// Why a value could not be written. Carries no text: nothing here formats
/// floats or messages.
#[derive(Debug)]
pub(crate) struct Error;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("value not representable in JS")
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Error
    }
}

/// JSON text under construction.
pub(crate) struct Json(String);

impl Json {
    fn string(&mut self, s: &str) {
        self.0.push('"');
        for c in s.chars() {
            match c {
                '"' => self.0.push_str("\\\""),
                '\\' => self.0.push_str("\\\\"),
                '\n' => self.0.push_str("\\n"),
                '\t' => self.0.push_str("\\t"),
                '\r' => self.0.push_str("\\r"),
                '\u{8}' => self.0.push_str("\\b"),
                '\u{c}' => self.0.push_str("\\f"),
                c if u32::from(c) < 0x20 => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    let n = u32::from(c) as usize;
                    self.0.push_str("\\u00");
                    self.0.push(char::from(HEX[n >> 4]));
                    self.0.push(char::from(HEX[n & 15]));
                }
                c => self.0.push(c),
            }
        }
        self.0.push('"');
    }

    /// A decimal integer, without `core::fmt`.
    fn int(&mut self, negative: bool, v: u64) {
        if negative {
            self.0.push('-');
        }
        recovery_core::text::push_decimal(&mut self.0, v);
    }

    /// Opens `{"variant":` for an externally tagged variant.
    fn tag(&mut self, variant: &str) {
        self.0.push('{');
        self.string(variant);
        self.0.push(':');
    }

    /// A separator before every element but the first.
    fn comma(&mut self, first: &mut bool) {
        if !std::mem::replace(first, false) {
            self.0.push(',');
        }
    }
}

/// An array or object under construction: whether the next element is the
/// first, and whether a tagged variant's `}` closes it too.
pub(crate) struct Compound<'a> {
    out: &'a mut Json,
    first: bool,
    tagged: bool,
}

impl Compound<'_> {
    fn close(self, bracket: char) {
        self.out.0.push(bracket);
        if self.tagged {
            self.out.0.push('}');
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.out.comma(&mut self.first);
        value.serialize(&mut *self.out)
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), Error> {
        self.out.comma(&mut self.first);
        self.out.string(key);
        self.out.0.push(':');
        value.serialize(&mut *self.out)
    }
}

impl ser::SerializeSeq for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close(']');
        Ok(())
    }
}

impl ser::SerializeTuple for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close(']');
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close(']');
        Ok(())
    }
}

impl ser::SerializeTupleVariant for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close(']');
        Ok(())
    }
}

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // serde_json's keys: strings (the engine's maps have no others).
        self.out.comma(&mut self.first);
        let at = self.out.0.len();
        key.serialize(&mut *self.out)?;
        if !matches!(self.out.0.as_bytes().get(at), Some(b'"')) {
            return Err(Error);
        }
        self.out.0.push(':');
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut *self.out)
    }
    fn end(self) -> Result<(), Error> {
        self.close('}');
        Ok(())
    }
}

impl ser::SerializeStruct for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key, value)
    }
    fn end(self) -> Result<(), Error> {
        self.close('}');
        Ok(())
    }
}

impl ser::SerializeStructVariant for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key, value)
    }
    fn end(self) -> Result<(), Error> {
        self.close('}');
        Ok(())
    }
}

impl<'a> ser::Serializer for &'a mut Json {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.0.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.int(v < 0, v.unsigned_abs());
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.int(false, v);
        Ok(())
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Error> {
        // None of the engine's types holds a float.
        Err(Error)
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Error> {
        Err(Error)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.string(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.string(v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // serde_json: an array of numbers.
        use ser::SerializeSeq as _;
        let mut seq = self.serialize_seq(None)?;
        for b in v {
            seq.serialize_element(b)?;
        }
        ser::SerializeSeq::end(seq)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.0.push_str("null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.tag(variant);
        value.serialize(&mut *self)?;
        self.0.push('}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>, Error> {
        self.0.push('[');
        Ok(Compound {
            out: self,
            first: true,
            tagged: false,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.tag(variant);
        self.0.push('[');
        Ok(Compound {
            out: self,
            first: true,
            tagged: true,
        })
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>, Error> {
        self.0.push('{');
        Ok(Compound {
            out: self,
            first: true,
            tagged: false,
        })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Compound<'a>, Error> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.tag(variant);
        self.0.push('{');
        Ok(Compound {
            out: self,
            first: true,
            tagged: true,
        })
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, _value: &T) -> Result<(), Error> {
        // Nothing the engine serializes goes through `Display`.
        Err(Error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same<T: Serialize>(v: &T) {
        assert_eq!(to_json(v), serde_json::to_string(v).unwrap());
    }

    #[test]
    fn strings_numbers_and_containers_are_written_as_serde_json_writes_them() {
        same(&"a\"b\\c\u{1}\u{1f}\n\t\r\u{8}\u{c} / é 😀 \u{7f} \u{2028}");
        same(&(u64::MAX, i64::MIN, 0u8, -7i32, true, 'x', ()));
        same(&vec![Some(1u64), None]);
        let map: std::collections::BTreeMap<String, Vec<u16>> =
            [("k".to_owned(), vec![1, 2]), ("\"q".to_owned(), vec![])].into();
        same(&map);
    }
}
