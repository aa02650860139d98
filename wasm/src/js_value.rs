//! Events, reports and outcomes as plain JS values, built directly from
//! their `Serialize` impls: the same shape `JSON.parse(serde_json::to_string(v))`
//! gives (field names and order, tags, `null` for `None`, unit variants as
//! strings, non-finite floats as `null`), with no JSON text in between and no
//! number formatting in the module.

use std::fmt;

use js_sys::{Array, Object, Reflect};
use serde::Serialize;
use serde::ser;
use wasm_bindgen::JsValue;

/// `value` as a plain JS object (or array, string, number…); `null` when it
/// cannot be represented (never for the engine's types).
pub(crate) fn to_js<T: Serialize + ?Sized>(value: &T) -> JsValue {
    value.serialize(Js).unwrap_or(JsValue::NULL)
}

/// Why a value could not be built. Carries no text: nothing here formats.
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

fn set(target: &JsValue, key: &JsValue, value: &JsValue) -> Result<(), Error> {
    Reflect::set(target, key, value)
        .map(|_| ())
        .map_err(|_| Error)
}

/// `{ [variant]: value }`, serde's externally tagged form.
fn tagged(variant: &'static str, value: &JsValue) -> Result<JsValue, Error> {
    let obj: JsValue = Object::new().into();
    set(&obj, &JsValue::from_str(variant), value)?;
    Ok(obj)
}

#[derive(Clone, Copy)]
struct Js;

/// An array under construction; `variant` wraps it for a tuple variant.
pub(crate) struct Seq {
    array: Array,
    variant: Option<&'static str>,
}

/// An object under construction; `variant` wraps it for a struct variant.
pub(crate) struct Obj {
    target: JsValue,
    key: JsValue,
    variant: Option<&'static str>,
}

fn finish(value: JsValue, variant: Option<&'static str>) -> Result<JsValue, Error> {
    match variant {
        Some(v) => tagged(v, &value),
        None => Ok(value),
    }
}

impl ser::SerializeSeq for Seq {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.array.push(&value.serialize(Js)?);
        Ok(())
    }
    fn end(self) -> Result<JsValue, Error> {
        finish(self.array.into(), self.variant)
    }
}

impl ser::SerializeTuple for Seq {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<JsValue, Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for Seq {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<JsValue, Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleVariant for Seq {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<JsValue, Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeMap for Obj {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // A string, or a number JS turns into the same text serde_json
        // writes for an integer key.
        self.key = key.serialize(Js)?;
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        set(&self.target, &self.key, &value.serialize(Js)?)
    }
    fn end(self) -> Result<JsValue, Error> {
        finish(self.target, self.variant)
    }
}

impl ser::SerializeStruct for Obj {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        set(&self.target, &JsValue::from_str(key), &value.serialize(Js)?)
    }
    fn end(self) -> Result<JsValue, Error> {
        finish(self.target, self.variant)
    }
}

impl ser::SerializeStructVariant for Obj {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        ser::SerializeStruct::serialize_field(self, key, value)
    }
    fn end(self) -> Result<JsValue, Error> {
        ser::SerializeStruct::end(self)
    }
}

fn obj(variant: Option<&'static str>) -> Obj {
    Obj {
        target: Object::new().into(),
        key: JsValue::UNDEFINED,
        variant,
    }
}

fn seq(variant: Option<&'static str>) -> Seq {
    Seq {
        array: Array::new(),
        variant,
    }
}

impl ser::Serializer for Js {
    type Ok = JsValue;
    type Error = Error;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Seq;
    type SerializeMap = Obj;
    type SerializeStruct = Obj;
    type SerializeStructVariant = Obj;

    fn serialize_bool(self, v: bool) -> Result<JsValue, Error> {
        Ok(JsValue::from_bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<JsValue, Error> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<JsValue, Error> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<JsValue, Error> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<JsValue, Error> {
        // The nearest double, as `JSON.parse` reads the integer.
        self.serialize_f64(v as f64)
    }
    fn serialize_u8(self, v: u8) -> Result<JsValue, Error> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<JsValue, Error> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<JsValue, Error> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<JsValue, Error> {
        self.serialize_f64(v as f64)
    }
    fn serialize_f32(self, v: f32) -> Result<JsValue, Error> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<JsValue, Error> {
        // serde_json writes non-finite numbers as `null`.
        Ok(if v.is_finite() {
            JsValue::from_f64(v)
        } else {
            JsValue::NULL
        })
    }
    fn serialize_char(self, v: char) -> Result<JsValue, Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<JsValue, Error> {
        Ok(JsValue::from_str(v))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<JsValue, Error> {
        // serde_json: an array of numbers.
        let array = Array::new();
        for b in v {
            array.push(&JsValue::from_f64(f64::from(*b)));
        }
        Ok(array.into())
    }
    fn serialize_none(self) -> Result<JsValue, Error> {
        Ok(JsValue::NULL)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<JsValue, Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<JsValue, Error> {
        Ok(JsValue::NULL)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<JsValue, Error> {
        Ok(JsValue::NULL)
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<JsValue, Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<JsValue, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<JsValue, Error> {
        tagged(variant, &value.serialize(self)?)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq, Error> {
        Ok(seq(None))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Seq, Error> {
        Ok(seq(None))
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Seq, Error> {
        Ok(seq(None))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq, Error> {
        Ok(seq(Some(variant)))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Obj, Error> {
        Ok(obj(None))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Obj, Error> {
        Ok(obj(None))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Obj, Error> {
        Ok(obj(Some(variant)))
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, _value: &T) -> Result<JsValue, Error> {
        // Nothing the engine serializes goes through `Display`.
        Err(Error)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use recovery_core::budget::AttemptAllowance;
    use recovery_core::engine::Recovery;
    use recovery_core::failure::{Failure, Phase, TransportKind};
    use recovery_core::lifecycle::CommitTrigger;
    use recovery_core::outcome::CancelPhase;
    use recovery_core::policy::RecoveryPolicy;
    use recovery_core::progress::{Progress, Proof, SemanticKind};
    use recovery_core::retry_after::RetryAfter;
    use recovery_core::safe::SafeToken;
    use recovery_core::timing::{Fraction, Instant};
    use wasm_bindgen_test::wasm_bindgen_test;

    use super::*;

    /// `to_js(v)` reads back as the JSON serde_json writes for `v`.
    fn same<T: Serialize>(v: &T) {
        let js = js_sys::JSON::stringify(&to_js(v))
            .map(String::from)
            .unwrap();
        let json = serde_json::to_string(v).unwrap();
        assert_eq!(js, json);
    }

    fn at(ms: u64) -> Instant {
        Instant::from_origin(Duration::from_millis(ms))
    }

    #[wasm_bindgen_test]
    fn events_report_and_outcome_keep_the_serde_shape() {
        let mut engine = Recovery::new(
            RecoveryPolicy::default(),
            AttemptAllowance::new(3),
            42,
            at(0),
        );
        engine.begin_attempt(at(1), false, false).unwrap();
        engine.head_received(at(5), 503, SafeToken::new("req_1"));
        let failure = Failure::status(503, RetryAfter::Seconds(Duration::from_secs(1)), None);
        same(&failure);
        engine.fail(at(6), failure, true, Fraction::new(0.25));
        engine.begin_attempt(at(1200), false, false).unwrap();
        engine.fail(
            at(1300),
            Failure::transport(TransportKind::Other, Phase::Unknown),
            true,
            Fraction::new(0.5),
        );
        engine.begin_attempt(at(2500), false, false).unwrap();
        engine.head_received(at(2510), 200, None);
        engine.commit(at(2520), CommitTrigger::Semantic);
        let mut progress = Progress::default();
        progress.observe(SemanticKind::Content);
        progress.deliver_observed();
        progress.delivered_bytes = 1234;
        let outcome = engine.succeed(at(3000), Proof::Strong, progress);
        same(&outcome);
        let events: Vec<_> = engine.drain_events().collect();
        assert!(events.len() > 5);
        for e in &events {
            same(e);
        }
        same(engine.report());

        let mut cancelled = Recovery::new(
            RecoveryPolicy::default(),
            AttemptAllowance::new(1),
            7,
            at(0),
        );
        cancelled.begin_attempt(at(1), false, false).unwrap();
        same(&cancelled.cancel(at(2), CancelPhase::AwaitingHead));
        for e in cancelled.drain_events() {
            same(&e);
        }
        same(cancelled.report());
    }
}
