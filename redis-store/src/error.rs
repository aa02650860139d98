//! The errors a store can be built with, and URLs shown without secrets.

use std::fmt;

/// Why a store could not be built. Nothing here carries a password: a URL
/// is kept only in its [`RedactedUrl`] form.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The Redis URL cannot be used.
    InvalidUrl {
        /// The URL, with its password and `pass` parameter masked.
        url: RedactedUrl,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An option is out of range.
    InvalidOption {
        /// The option's name, as the builder method spells it.
        option: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `connect` was called outside a tokio runtime: the store's background
    /// task needs one.
    NoRuntime,
}

impl fmt::Display for RedisStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisStoreError::InvalidUrl { url, reason } => {
                write!(f, "invalid Redis URL {url}: {reason}")
            }
            RedisStoreError::InvalidOption { option, reason } => {
                write!(f, "invalid option {option}: {reason}")
            }
            RedisStoreError::NoRuntime => {
                f.write_str("a Redis store must be connected inside a tokio runtime")
            }
        }
    }
}

impl std::error::Error for RedisStoreError {}

/// A Redis URL fit to print: the password of `redis://user:secret@host`
/// and the value of a `pass=` or `password=` parameter read `***`. A text
/// that does not parse as a URL is not shown at all.
#[derive(Clone, PartialEq, Eq)]
pub struct RedactedUrl(String);

impl RedactedUrl {
    /// The redacted form of `url`.
    pub fn new(url: &str) -> Self {
        let Ok(mut parsed) = url::Url::parse(url) else {
            return RedactedUrl("<not a URL>".to_owned());
        };
        if parsed.password().is_some() {
            // Only a URL with a host can hold a password, and such a URL
            // accepts a new one.
            let _ = parsed.set_password(Some("***"));
        }
        if parsed.query().is_some() {
            let pairs: Vec<(String, String)> = parsed
                .query_pairs()
                .map(|(k, v)| {
                    let secret =
                        k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password");
                    let value = if secret {
                        "***".to_owned()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), value)
                })
                .collect();
            parsed.query_pairs_mut().clear().extend_pairs(pairs);
        }
        RedactedUrl(parsed.into())
    }

    /// The redacted text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A client for `url`, or why there is none.
pub(crate) fn open(url: &str) -> Result<redis::Client, RedisStoreError> {
    let invalid = |reason| RedisStoreError::InvalidUrl {
        url: RedactedUrl::new(url),
        reason,
    };
    let parsed = url::Url::parse(url).map_err(|_| invalid("not a URL"))?;
    match parsed.scheme() {
        "redis" | "valkey" => {
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(invalid("no host"));
            }
        }
        "unix" | "redis+unix" | "valkey+unix" => {
            if parsed.path().is_empty() || parsed.path() == "/" {
                return Err(invalid("no socket path"));
            }
        }
        "rediss" | "valkeys" => {
            return Err(invalid("TLS (rediss://) is not supported by this build"));
        }
        _ => {
            return Err(invalid(
                "unsupported scheme (use redis://, redis+unix:// or unix://)",
            ));
        }
    }
    redis::Client::open(url)
        .map_err(|_| invalid("rejected by the Redis client (database, user or protocol parameter)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let shown = RedactedUrl::new("redis://alice:s3cret@cache.internal:6380/2");
        assert_eq!(shown.as_str(), "redis://alice:***@cache.internal:6380/2");
        let shown = RedactedUrl::new("redis+unix:///run/redis.sock?db=1&pass=s3cret");
        assert_eq!(shown.as_str(), "redis+unix:///run/redis.sock?db=1&pass=***");
        assert_eq!(RedactedUrl::new("s3cret nonsense").as_str(), "<not a URL>");
        let err = open("redis://:s3cret@cache.internal/notanumber").unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("***"), "{text}");
    }

    #[test]
    fn bad_urls_are_typed_errors() {
        for (url, reason) in [
            ("not a url", "not a URL"),
            ("http://localhost:6379", "unsupported scheme"),
            ("rediss://localhost", "TLS"),
            ("unix://", "no socket path"),
            ("redis://localhost/notanumber", "rejected"),
        ] {
            match open(url) {
                Err(RedisStoreError::InvalidUrl { reason: r, .. }) => {
                    assert!(r.contains(reason), "{url}: {r}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(open("redis://127.0.0.1:6379/0").is_ok());
        assert!(open("redis+unix:///tmp/redis.sock").is_ok());
    }
}
