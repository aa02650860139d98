//! Events, reports and outcomes as plain JS values: their `Serialize`
//! impls write JSON text (integers and strings only: none of these types
//! holds a float) that `JSON.parse` turns into the same object
//! `serde_json::to_string` would give, field names and order, tags, `null`
//! for `None` and unit variants as strings included. No serde_json and no
//! float formatting in the module.

use std::fmt;
use std::fmt::Write as _;

use serde::Serialize;
use serde::ser;
use wasm_bindgen::JsValue;

/// `value` as a plain JS object (or array, string, number…); `null` when it
/// cannot be represented (never for the engine's types).
pub(crate) fn to_js<T: Serialize + ?Sized>(value: &T) -> JsValue {
    let mut out = Json(String::new());
    match value.serialize(&mut out) {
        Ok(()) => js_sys::JSON::parse(&out.0).unwrap_or(JsValue::NULL),
        Err(Error) => JsValue::NULL,
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
                c if u32::from(c) < 0x20 => {
                    let _ = write!(self.0, "\\u{:04x}", u32::from(c));
                }
                c => self.0.push(c),
            }
        }
        self.0.push('"');
    }

    fn int(&mut self, v: impl fmt::Display) {
        let _ = write!(self.0, "{v}");
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
        if !self.out.0[at..].starts_with('"') {
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
        self.int(v);
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
        self.int(v);
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
    use std::borrow::Cow;
    use std::collections::VecDeque;
    use std::time::Duration;

    use recovery_core::budget::AttemptAllowance;
    use recovery_core::exchange::{Exchange, Head, Io, RequestFacts};
    use recovery_core::failure::{Failure, Phase, TransportKind};
    use recovery_core::policy::RecoveryPolicy;
    use recovery_core::protocol::{ProtocolChoice, ProtocolKind};
    use recovery_core::timing::{AlwaysOnline, ManualTiming, Timing};
    use wasm_bindgen_test::wasm_bindgen_test;

    use super::*;

    /// `to_js(v)` is the value `JSON.parse(serde_json::to_string(v))` gives
    /// (compared as `JSON.stringify` text).
    fn same<T: Serialize>(v: &T) {
        let text = |v: &JsValue| js_sys::JSON::stringify(v).map(String::from).unwrap();
        let json = serde_json::to_string(v).unwrap();
        assert_eq!(text(&to_js(v)), text(&js_sys::JSON::parse(&json).unwrap()));
    }

    /// One attempt's answer: a status, a content type, the body's chunks
    /// and whether the connection is reset after them.
    struct Answer {
        status: u16,
        retry_after: Option<&'static str>,
        chunks: VecDeque<&'static [u8]>,
        reset: bool,
    }

    impl Head for Answer {
        fn status(&self) -> u16 {
            self.status
        }
        fn header(&self, name: &str) -> Option<Cow<'_, str>> {
            match name {
                "content-type" if self.status == 200 => Some("text/event-stream".into()),
                "content-type" => Some("application/json".into()),
                "retry-after" => self.retry_after.map(Cow::Borrowed),
                _ => None,
            }
        }
    }

    /// Plays `answers` through the machine on a virtual clock, as a driver
    /// would, and returns it ended.
    fn play(cancel_at_head: bool, answers: Vec<Answer>) -> Exchange<Vec<u8>> {
        let env = (ManualTiming::new(7), AlwaysOnline);
        let mut ex = Exchange::<Vec<u8>>::new(
            RecoveryPolicy::default(),
            &ProtocolChoice::Fixed(ProtocolKind::OpenAiChat),
            RequestFacts::new("POST", "http://127.0.0.1/v1/chat/completions", b"{}"),
            AttemptAllowance::new(3),
            42,
            env.0.now(),
        );
        let mut answers = answers.into_iter();
        let mut answer = None;
        for _ in 0..1000 {
            match ex.poll(&env) {
                Io::Send(_) => {
                    ex.on_sent(&env);
                    answer = answers.next();
                }
                Io::AwaitHead if cancel_at_head => ex.cancel(&env),
                Io::AwaitHead => ex.on_head(&env, answer.as_ref().unwrap(), None),
                Io::Read => {
                    let a = answer.as_mut().unwrap();
                    if let Some(chunk) = a.chunks.pop_front() {
                        ex.on_chunk(&env, chunk.to_vec());
                    } else if a.reset {
                        let reset = Failure::transport(TransportKind::Reset, Phase::Streaming);
                        ex.on_error(&env, reset);
                    } else {
                        ex.on_end(&env);
                    }
                }
                Io::Sleep => {
                    let due = ex.poll_timeout().unwrap();
                    env.0.advance(due.saturating_since(env.0.now()));
                    ex.handle_timeout(&env);
                }
                Io::End(_) => return ex,
                _ => {}
            }
        }
        panic!("the machine did not end");
    }

    #[wasm_bindgen_test]
    fn strings_numbers_and_containers_read_back_as_serde_json_wrote_them() {
        same(&"a\"b\\c\u{1}\u{1f}\n\t\r\u{8}\u{c} / é 😀 \u{7f} \u{2028}");
        same(&(u64::MAX, i64::MIN, 0u8, true, 'x', ()));
        same(&vec![Some(1u64), None]);
        let map: std::collections::BTreeMap<String, Vec<u16>> =
            [("k".to_owned(), vec![1, 2]), ("\"q".to_owned(), vec![])].into();
        same(&map);
    }

    #[wasm_bindgen_test]
    fn events_report_and_outcome_keep_the_serde_shape() {
        // A 503 with Retry-After, a reset before any output, then a stream
        // that completes: every kind of record a report holds.
        let mut ex = play(
            false,
            vec![
                Answer {
                    status: 503,
                    retry_after: Some("1"),
                    chunks: [&br#"{"error":{"code":"server_error"}}"#[..]].into(),
                    reset: false,
                },
                Answer {
                    status: 200,
                    retry_after: None,
                    chunks: [&b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"[..]].into(),
                    reset: true,
                },
                Answer {
                    status: 200,
                    retry_after: None,
                    chunks: [
                        &b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"[..],
                        &b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"[..],
                    ]
                    .into(),
                    reset: false,
                },
            ],
        );
        same(&Failure::status(
            503,
            recovery_core::failure::RetryAfter::Seconds(Duration::from_secs(1)),
            None,
        ));
        same(ex.outcome().unwrap());
        let events: Vec<_> = ex.drain_events().collect();
        assert!(events.len() > 5, "{events:?}");
        for e in &events {
            same(e);
        }
        same(ex.report());
        assert_eq!(ex.report().attempts.len(), 3);

        let mut cancelled = play(true, Vec::new());
        same(cancelled.outcome().unwrap());
        for e in cancelled.drain_events() {
            same(&e);
        }
        same(cancelled.report());
    }
}
