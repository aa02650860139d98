//! Whose keys a request may spend.
//!
//! Without `[[clients]]` the gateway serves one user: a request goes
//! upstream with the credentials it brought, and operator credentials in
//! the configuration (a route's or the default upstream's `headers`, an
//! alternate's) are honoured only on a loopback listener, which
//! the gateway enforces at start-up (it refuses to start otherwise).
//!
//! With `[[clients]]` every request but `GET /healthz` must carry a known
//! client key where its SDK already sends an API key (`authorization:
//! Bearer …`, `x-api-key`, `x-goog-api-key`, `api-key`), so an SDK needs
//! only `api_key=<client key>`. A missing or unknown key is a `401` and
//! nothing goes upstream. A known client's request goes with the client key
//! and every other credential header removed, and the operator's
//! credentials of its route (or alternate) set.
//!
//! The configuration keeps SHA-256 digests of client keys, never keys
//! (`recovery-gateway hash-key` prints an entry). A presented key is
//! hashed and compared with every entry in constant time.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName};
use recovery_core::failover::CREDENTIAL_HEADERS;
use ring::digest;

use crate::respond::Refusal;

/// The headers a client key may come in.
const KEY_HEADERS: [&str; 4] = ["authorization", "x-api-key", "x-goog-api-key", "api-key"];

/// The shortest client key `hash-key` accepts: an unsalted digest of a
/// short key could be reversed by trying keys.
pub const MIN_CLIENT_KEY_LEN: usize = 16;

/// One `[[clients]]` entry.
#[derive(Clone, PartialEq, Eq)]
pub struct Client {
    /// A name for logs.
    pub name: String,
    /// SHA-256 of the client's key.
    pub key_hash: [u8; 32],
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Parses `key_hash = "sha256:<64 hex digits>"`.
    pub fn parse_hash(text: &str) -> Option<[u8; 32]> {
        let hex = text.strip_prefix("sha256:")?;
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(out)
    }
}

/// The `[[clients]]` entry for `key`, as `recovery-gateway hash-key`
/// prints it.
pub fn client_entry(name: &str, key: &str) -> String {
    let hash = digest::digest(&digest::SHA256, key.as_bytes());
    let hex = hash.as_ref().iter().fold(String::new(), |mut out, b| {
        use std::fmt::Write as _;
        let _ = write!(out, "{b:02x}");
        out
    });
    let name = serde_json::Value::from(name).to_string();
    format!("[[clients]]\nname = {name}\nkey_hash = \"sha256:{hex}\"\n")
}

/// The clients the gateway knows; empty: client authentication is off.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clients(Vec<Client>);

/// Whose credentials a request goes upstream with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// Its own (no `[[clients]]`).
    Own,
    /// The operator's: a known client, by name.
    Operator(String),
}

fn ct_eq(a: &[u8; 32], b: &[u8]) -> bool {
    if b.len() != 32 {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Clients {
    pub(crate) fn new(clients: Vec<Client>) -> Self {
        Clients(clients)
    }

    /// Whether client authentication is on.
    pub(crate) fn enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// The credentials a request with `headers` is sent with, or the
    /// `401` when clients are configured and it names none.
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<Credentials, Refusal> {
        if self.0.is_empty() {
            return Ok(Credentials::Own);
        }
        let mut found: Option<usize> = None;
        for name in KEY_HEADERS {
            for value in headers.get_all(name) {
                let raw = value.as_bytes();
                let key = if name == "authorization" {
                    strip_bearer(raw)
                } else {
                    raw
                };
                let hash = digest::digest(&digest::SHA256, key);
                // Every entry is compared, whichever matches.
                for (i, c) in self.0.iter().enumerate() {
                    if ct_eq(&c.key_hash, hash.as_ref()) {
                        found = Some(i);
                    }
                }
            }
        }
        match found {
            Some(i) => Ok(Credentials::Operator(self.0[i].name.clone())),
            None => Err(Refusal::Unauthorized),
        }
    }
}

fn strip_bearer(raw: &[u8]) -> &[u8] {
    match raw.get(..7) {
        Some(p) if p.eq_ignore_ascii_case(b"bearer ") => raw[7..].trim_ascii_start(),
        _ => raw,
    }
}

impl Credentials {
    /// Sets the upstream request's credentials: a known client's key and
    /// every other credential header go, the operator's `headers` come.
    pub(crate) fn apply(&self, upstream: &mut HeaderMap, operator: &HeaderMap) {
        if let Credentials::Operator(_) = self {
            for name in CREDENTIAL_HEADERS.iter().chain(KEY_HEADERS.iter()) {
                upstream.remove(*name);
            }
        }
        for (name, value) in operator {
            upstream.insert(name, value.clone());
        }
    }
}

/// Whether a header configured by the operator is a credential.
pub(crate) fn is_credential(name: &HeaderName, extra: &[HeaderName]) -> bool {
    CREDENTIAL_HEADERS.contains(&name.as_str()) || extra.contains(name)
}

/// Where the configuration holds operator credentials: the credential
/// headers of the default upstream, of routes and of alternates.
pub(crate) fn operator_credentials(config: &crate::Config) -> Vec<String> {
    let extra: Vec<_> = config
        .routes
        .iter()
        .filter_map(|r| r.credential_header.clone())
        .collect();
    let names = |h: &http::HeaderMap| -> Vec<String> {
        h.keys()
            .filter(|n| is_credential(n, &extra))
            .map(|n| n.as_str().to_owned())
            .collect()
    };
    let mut out = Vec::new();
    for n in names(&config.upstream_headers) {
        out.push(format!("upstream_headers: {n}"));
    }
    for r in &config.routes {
        for n in names(&r.headers) {
            out.push(format!("route {:?}: {n}", r.prefix));
        }
    }
    for a in &config.alternates {
        for n in a.alternate.header_names() {
            if is_credential(&n, &extra) {
                out.push(format!("alternate {:?}: {n}", a.alternate.label()));
            }
        }
    }
    out
}

/// Refuses a listener others can reach that would spend the operator's
/// credentials for anyone: `Err` with the message naming the fix when
/// `listen` is not loopback, `[[clients]]` are not configured and `where_`
/// (the places operator credentials are configured) is not empty.
pub(crate) fn operator_exposure(
    listen: SocketAddr,
    clients: &Clients,
    where_: &[String],
) -> Result<(), String> {
    if clients.enabled() || where_.is_empty() || listen.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "operator credentials are configured ({}) and the listener {listen} is not loopback: \
         anyone who reaches it would spend them. Add [[clients]] entries \
         (`recovery-gateway hash-key` prints one) or listen on 127.0.0.1",
        where_.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients() -> Clients {
        let entry = client_entry("team-a", "ck-0123456789abcdef");
        let hash = entry
            .lines()
            .find_map(|l| l.strip_prefix("key_hash = \""))
            .unwrap()
            .trim_end_matches('"');
        Clients::new(vec![Client {
            name: "team-a".into(),
            key_hash: Client::parse_hash(hash).unwrap(),
        }])
    }

    fn with(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        h
    }

    #[test]
    fn a_known_key_in_any_sdk_header_is_the_client() {
        let c = clients();
        for (name, value) in [
            ("authorization", "Bearer ck-0123456789abcdef"),
            ("authorization", "bearer ck-0123456789abcdef"),
            ("x-api-key", "ck-0123456789abcdef"),
            ("x-goog-api-key", "ck-0123456789abcdef"),
            ("api-key", "ck-0123456789abcdef"),
        ] {
            assert_eq!(
                c.check(&with(name, value)),
                Ok(Credentials::Operator("team-a".into())),
                "{name}"
            );
        }
        for h in [
            HeaderMap::new(),
            with("authorization", "Bearer ck-0123456789abcdeF"),
            with("x-api-key", "sk-provider-key"),
        ] {
            assert_eq!(c.check(&h), Err(Refusal::Unauthorized));
        }
        assert_eq!(
            Clients::default().check(&HeaderMap::new()),
            Ok(Credentials::Own)
        );
    }

    #[test]
    fn the_client_key_never_goes_upstream() {
        let mut up = with("authorization", "Bearer ck-0123456789abcdef");
        up.insert("x-goog-api-key", "g".parse().unwrap());
        up.insert("accept", "text/event-stream".parse().unwrap());
        let operator = with("x-api-key", "sk-operator");
        Credentials::Operator("team-a".into()).apply(&mut up, &operator);
        assert!(up.get("authorization").is_none());
        assert!(up.get("x-goog-api-key").is_none());
        assert_eq!(up["x-api-key"], "sk-operator");
        assert_eq!(up["accept"], "text/event-stream");
        let mut own = with("authorization", "Bearer sk-own");
        Credentials::Own.apply(&mut own, &HeaderMap::new());
        assert_eq!(own["authorization"], "Bearer sk-own");
    }

    #[test]
    fn hashes_parse_strictly() {
        assert!(Client::parse_hash(&format!("sha256:{}", "ab".repeat(32))).is_some());
        assert!(Client::parse_hash(&"ab".repeat(32)).is_none());
        assert!(Client::parse_hash(&format!("sha256:{}", "zz".repeat(32))).is_none());
        assert!(Client::parse_hash("sha256:ab").is_none());
        assert!(!format!("{:?}", clients()).contains("key_hash: ["));
    }

    #[test]
    fn operator_keys_on_an_open_listener_need_clients() {
        let open: SocketAddr = "0.0.0.0:8787".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:8787".parse().unwrap();
        let at = vec!["alternate \"b\": x-api-key".to_owned()];
        let e = operator_exposure(open, &Clients::default(), &at).unwrap_err();
        assert!(
            e.contains("[[clients]]") && e.contains("hash-key") && e.contains("127.0.0.1"),
            "{e}"
        );
        assert!(operator_exposure(lo, &Clients::default(), &at).is_ok());
        assert!(operator_exposure(open, &clients(), &at).is_ok());
        assert!(operator_exposure(open, &Clients::default(), &[]).is_ok());
    }
}
