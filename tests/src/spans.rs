//! A tracing layer that keeps every span's name and the fields recorded on
//! it (when the span is made and later), for tests of what spans carry.
//! Values are kept as their `Debug` text: a string quoted, a number bare.

use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// A span's name and the fields recorded on it, in order.
pub type SpanRecord = (String, Vec<(String, String)>);

/// The spans seen, in creation order. Clones share them.
#[derive(Clone, Default)]
pub struct Spans(Arc<Mutex<Vec<SpanRecord>>>);

impl Spans {
    /// Every span seen so far.
    pub fn all(&self) -> Vec<SpanRecord> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last value of `field` on the last span named `span`.
    pub fn field(&self, span: &str, field: &str) -> Option<String> {
        let spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, fields) = spans.iter().rev().find(|(n, _)| n == span)?;
        fields
            .iter()
            .rev()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v.clone())
    }
}

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((attrs.metadata().name().to_owned(), fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let name = ctx
            .span(id)
            .map(|s| s.name().to_owned())
            .unwrap_or_default();
        let mut fields = Vec::new();
        values.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = spans.iter_mut().rev().find(|(n, _)| *n == name) {
            entry.1.extend(fields);
        }
    }
}
