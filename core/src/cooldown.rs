//! A cooldown shared by the requests bound for one endpoint.
//!
//! A `429` or `503` with `Retry-After: 30` is news about the endpoint, not
//! only about the request that got it: every other request in flight to the
//! same place would learn it on its own, one failed send each. With a
//! shared store, when any request learns a wait (`Retry-After` in either
//! form, `retry-after-ms`), the others bound for the same key hold their
//! next send until the same instant; when that instant lies beyond what
//! they may wait (the policy's `Retry-After` ceiling, the recovery budget,
//! the deadline), they fail at once with
//! [`Outcome::RetryAfterRefused`](crate::outcome::Outcome::RetryAfterRefused)
//! instead of sending.
//!
//! The key is the endpoint's origin and the request's model (the top-level
//! `"model"` of a JSON body; the URL path when there is none, as Gemini
//! names the model there): providers limit per model and organisation, and
//! one model's overload says nothing about another's.
//!
//! [`CooldownStore`] is the seam: it speaks in waits relative to the
//! caller's clock, never in instants, so a store may live in another
//! process (a fleet sharing one provider key) without sharing a clock.
//! [`Cooldowns`] is the in-memory store, shared by clones.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::body_fields::BodyFields;
use crate::timing::Instant;

/// Where the requests of one client (a layer and its clones, one recovering
/// fetch) share what endpoints asked them to wait.
pub trait CooldownStore: Send + Sync {
    /// The endpoint of `key` asked, at `now`, for no sends during `wait`.
    /// An end later than the one in force replaces it; an earlier one does
    /// not shorten it.
    fn note(&self, key: &str, now: Instant, wait: Duration);

    /// How long sends to `key` must still wait at `now`; `None` when they
    /// may go.
    fn remaining(&self, key: &str, now: Instant) -> Option<Duration>;
}

/// Keys an in-memory store keeps at most. Past it, expired entries go
/// first, then the one ending soonest: the map never grows without bound.
const MAX_KEYS: usize = 1024;

/// The in-memory [`CooldownStore`] on the injected clock. Clones share it.
///
/// A list, not a hash map: a client talks to a handful of endpoints and
/// models, a scan of them costs less than hashing the key, and the browser
/// module carries no hasher.
#[derive(Debug, Clone, Default)]
pub struct Cooldowns {
    until: Arc<Mutex<Vec<(String, Instant)>>>,
}

impl Cooldowns {
    /// An empty store.
    pub fn new() -> Self {
        Cooldowns::default()
    }
}

impl CooldownStore for Cooldowns {
    fn note(&self, key: &str, now: Instant, wait: Duration) {
        if wait.is_zero() {
            return;
        }
        let end = now.saturating_add(wait);
        let mut until = self.until.lock().expect("cooldowns");
        if let Some((_, current)) = until.iter_mut().find(|(k, _)| k == key) {
            *current = (*current).max(end);
            return;
        }
        if until.len() >= MAX_KEYS {
            until.retain(|(_, e)| *e > now);
        }
        if until.len() >= MAX_KEYS
            && let Some(soonest) = (0..until.len()).min_by_key(|&i| until[i].1)
        {
            until.swap_remove(soonest);
        }
        until.push((key.to_owned(), end));
    }

    fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        let until = self.until.lock().expect("cooldowns");
        let (_, end) = until.iter().find(|(k, _)| k == key)?;
        (*end > now).then(|| end.saturating_since(now))
    }
}

/// The cooldown key of a request to `url` (absolute, or a path) with
/// `body`: the origin, then the model as the body's JSON spells it (or the
/// path when the body names none).
pub fn key_for(url: &str, body: &[u8]) -> String {
    key_of(url, &BodyFields::read(body))
}

/// [`key_for`] with the body's fields already read.
pub fn key_of(url: &str, body: &BodyFields<'_>) -> String {
    let u = url.as_bytes();
    let ends = |from: usize, stops: &[u8]| {
        u[from..]
            .iter()
            .position(|b| stops.contains(b))
            .map_or(u.len(), |i| from + i)
    };
    let origin_end = u
        .windows(3)
        .position(|w| w == b"://")
        .map_or(0, |i| ends(i + 3, b"/?#"));
    // ASCII boundaries: `get` never misses, and keeps str slicing's panic
    // path (and its `Debug` formatting) out of the wasm module.
    let mut key = url
        .get(..origin_end)
        .unwrap_or_default()
        .to_ascii_lowercase();
    key.push(' ');
    match body.model() {
        Some(model) => {
            key.push_str("model=");
            key.push_str(std::str::from_utf8(model.as_bytes()).unwrap_or_default());
        }
        None => key.push_str(
            url.get(origin_end..ends(origin_end, b"?#"))
                .unwrap_or_default(),
        ),
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_origin(Duration::from_millis(ms))
    }

    #[test]
    fn a_wait_is_shared_until_it_ends_and_never_shortened() {
        let store = Cooldowns::new();
        let other = store.clone();
        assert_eq!(store.remaining("k", at(0)), None);
        store.note("k", at(1_000), Duration::from_secs(2));
        assert_eq!(
            other.remaining("k", at(1_500)),
            Some(Duration::from_millis(1_500))
        );
        other.note("k", at(1_500), Duration::from_millis(100));
        assert_eq!(
            store.remaining("k", at(2_000)),
            Some(Duration::from_secs(1))
        );
        other.note("k", at(2_000), Duration::from_secs(5));
        assert_eq!(
            store.remaining("k", at(2_000)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(store.remaining("k", at(7_000)), None, "ended");
        assert_eq!(store.remaining("other", at(2_000)), None, "per key");
    }

    #[test]
    fn the_store_is_bounded() {
        let store = Cooldowns::new();
        for i in 0..(MAX_KEYS as u64 + 10) {
            store.note(&format!("k{i}"), at(0), Duration::from_secs(1 + i));
        }
        assert_eq!(store.until.lock().unwrap().len(), MAX_KEYS);
        assert_eq!(store.remaining("k0", at(0)), None, "the soonest went first");
        let last = format!("k{}", MAX_KEYS as u64 + 9);
        assert!(store.remaining(&last, at(0)).is_some());
    }

    #[test]
    fn keys_are_origin_and_model_or_path() {
        assert_eq!(
            key_for(
                "https://API.openai.com/v1/chat/completions?x=1",
                br#"{"model":"gpt-4o","stream":true}"#
            ),
            r#"https://api.openai.com model="gpt-4o""#
        );
        assert_eq!(
            key_for(
                "https://api.openai.com/v1/chat/completions",
                br#"{"model":"o3"}"#
            ),
            r#"https://api.openai.com model="o3""#,
            "another model, another key"
        );
        assert_eq!(
            key_for(
                "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
                br#"{"contents":[]}"#
            ),
            "https://generativelanguage.googleapis.com /v1beta/models/gemini-2.5-flash:streamGenerateContent"
        );
        assert_eq!(key_for("/v1/messages", b"not json"), " /v1/messages");
    }
}
