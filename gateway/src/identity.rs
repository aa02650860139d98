//! Who a stream belongs to: its public id, the credentials that created
//! it, the key the log keeps it under, and the short digest logs show.
//!
//! A stream id alone must not open a stream: ids travel in headers, event
//! ids and client logs. So the log never sees the public id. It keeps a
//! stream under `HMAC-SHA-256(secret, id ‖ owner)`, where `owner` is a
//! keyed hash of the credential headers of the request that created it.
//! A reconnect computes the same key from the id it names and the
//! credentials it carries: other credentials, or none, name another key,
//! which the log does not have, so the answer is exactly the `404` of an
//! id that never existed, with no comparison that could leak by timing.
//! A stream created without credentials belongs to "no credentials" and
//! is readable only by requests that carry none.
//!
//! The secret comes from the configuration, so every instance of a fleet
//! on one Redis log derives the same keys; without one it is drawn per
//! process (a reconnect then works on this instance only).
//!
//! Logs and metrics name a stream by [`StreamKey::digest`], the first
//! characters of its log key: enough to correlate lines, useless for
//! reading the stream.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{RngCore as _, SeedableRng as _};
use recovery_core::failover::CREDENTIAL_HEADERS;
use ring::hmac;

/// Random bytes in a stream id: 128 bits.
const ID_BYTES: usize = 16;
/// Length of an id: 16 bytes in unpadded base64url.
pub(crate) const ID_LEN: usize = 22;
/// Characters of a log key shown in logs.
const DIGEST_LEN: usize = 12;

thread_local! {
    /// Where ids come from: ChaCha20, a cryptographic generator, per
    /// thread, keyed once from the system's randomness, so an id costs no
    /// system call.
    static IDS: RefCell<ChaCha20Rng> = RefCell::new({
        let mut seed = [0u8; 32];
        fill_random(&mut seed);
        ChaCha20Rng::from_seed(seed)
    });
}

/// A new stream id: 128 random bits, URL-safe.
pub fn new_stream_id() -> String {
    let mut raw = [0u8; ID_BYTES];
    IDS.with_borrow_mut(|rng| rng.fill_bytes(&mut raw));
    base64url(&raw)
}

fn fill_random(raw: &mut [u8]) {
    if getrandom::fill(raw).is_err() {
        // No system randomness: the process cannot make unguessable ids.
        // Mix the clock and a counter so ids stay unique; they are then
        // guessable, which only the process's environment can fix.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for (i, b) in raw.iter_mut().enumerate() {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            *b = (t >> ((i % 16) * 8)) as u8 ^ n as u8;
        }
    }
}

pub(crate) fn base64url(raw: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(raw.len().div_ceil(3) * 4);
    for chunk in raw.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// Whether `s` has the shape of a stream id (so a `Last-Event-ID` that
/// does not is the upstream's business).
pub fn looks_like_stream_id(s: &str) -> bool {
    s.len() == ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The keyed hash of a request's credentials. Holds no credential.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Owner([u8; 32]);

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Owner(..)")
    }
}

/// The name a stream is kept under in the log.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct StreamKey(String);

impl StreamKey {
    /// The key as the log takes it.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// What logs show of it.
    pub(crate) fn digest(&self) -> &str {
        &self.0[..DIGEST_LEN.min(self.0.len())]
    }
}

impl std::fmt::Debug for StreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamKey({}..)", self.digest())
    }
}

/// Derives owners and log keys with one secret.
pub(crate) struct Keys {
    key: hmac::Key,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

impl Keys {
    /// Keys from the configured secret, or from 256 random bits.
    pub(crate) fn new(secret: Option<&[u8]>) -> Self {
        let key = if let Some(s) = secret {
            hmac::Key::new(hmac::HMAC_SHA256, s)
        } else {
            let mut raw = [0u8; 32];
            fill_random(&mut raw);
            hmac::Key::new(hmac::HMAC_SHA256, &raw)
        };
        Keys { key }
    }

    /// The owner of a request with these headers: every value of each
    /// credential header (and of `extra`, the headers routes name), in a
    /// fixed order, names and values length-prefixed so no two sets
    /// collide.
    pub(crate) fn owner(&self, headers: &HeaderMap, extra: &[HeaderName]) -> Owner {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"recovery-gateway owner v1\0");
        let names = CREDENTIAL_HEADERS
            .iter()
            .copied()
            .chain(extra.iter().map(HeaderName::as_str));
        for name in names {
            // A pass over the request's few headers per name: `get_all`
            // would parse and hash each name, most of them absent.
            let values = headers
                .iter()
                .filter(|(n, _)| n.as_str() == name)
                .map(|(_, v)| v);
            for value in values {
                for part in [name.as_bytes(), value.as_bytes()] {
                    ctx.update(&(part.len() as u64).to_be_bytes());
                    ctx.update(part);
                }
            }
        }
        let tag = ctx.sign();
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        Owner(out)
    }

    /// The log key of stream `id` owned by `owner`.
    pub(crate) fn stream_key(&self, id: &str, owner: &Owner) -> StreamKey {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"recovery-gateway stream v1\0");
        ctx.update(&owner.0);
        ctx.update(id.as_bytes());
        let tag = ctx.sign();
        // 128 bits of the tag: as hard to guess as the id itself.
        StreamKey(base64url(&tag.as_ref()[..ID_BYTES]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_url_safe_and_distinct() {
        let a = new_stream_id();
        let b = new_stream_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), ID_LEN);
        assert!(looks_like_stream_id(&a), "{a}");
        assert!(!looks_like_stream_id("short"));
        assert_eq!(base64url(b"\xff\xff\xff"), "____");
        assert_eq!(base64url(b"Ma"), "TWE");
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_stream_key_depends_on_the_credentials_and_the_secret() {
        let keys = Keys::new(Some(b"fleet secret"));
        let id = new_stream_id();
        let alice = keys.owner(&headers(&[("authorization", "Bearer a")]), &[]);
        let same = keys.owner(
            &headers(&[("authorization", "Bearer a"), ("accept", "x")]),
            &[],
        );
        let bob = keys.owner(&headers(&[("authorization", "Bearer b")]), &[]);
        let nobody = keys.owner(&HeaderMap::new(), &[]);
        let moved = keys.owner(&headers(&[("x-api-key", "Bearer a")]), &[]);
        assert_eq!(alice, same, "only credential headers count");
        assert_eq!(
            keys.owner(&headers(&[("x-api-key", "k"), ("authorization", "a")]), &[]),
            keys.owner(&headers(&[("authorization", "a"), ("x-api-key", "k")]), &[]),
            "credential headers count in a fixed order, not as they came"
        );
        let k = |o: &Owner| keys.stream_key(&id, o);
        assert_eq!(k(&alice), k(&same));
        for other in [&bob, &nobody, &moved] {
            assert_ne!(k(&alice), k(other));
        }
        let extra: HeaderName = "x-tenant-key".parse().unwrap();
        let with_extra = keys.owner(
            &headers(&[("authorization", "Bearer a"), ("x-tenant-key", "t")]),
            std::slice::from_ref(&extra),
        );
        assert_ne!(alice, with_extra, "a route's credential header counts");
        let fleet = Keys::new(Some(b"fleet secret"));
        assert_eq!(
            fleet.stream_key(
                &id,
                &fleet.owner(&headers(&[("authorization", "Bearer a")]), &[])
            ),
            k(&alice),
            "instances with one secret agree"
        );
        let other_process = Keys::new(None);
        assert_ne!(
            other_process.stream_key(
                &id,
                &other_process.owner(&headers(&[("authorization", "Bearer a")]), &[])
            ),
            k(&alice)
        );
        assert_eq!(k(&alice).as_str().len(), ID_LEN);
        assert_eq!(k(&alice).digest().len(), DIGEST_LEN);
        assert!(!format!("{:?} {:?}", alice, k(&alice)).contains(k(&alice).as_str()));
    }
}
