//! What is never forwarded, whatever the route: `CONNECT` and `TRACE`, an
//! absolute-form target naming another authority, and a path an upstream
//! could resolve outside the route's base ([`check_path`]).

use std::sync::Arc;

use http::{Method, Request};

use crate::phase::{Decision, Phase, Step};
use crate::respond::Refusal;

/// The admission phase.
pub(crate) struct Admit {
    /// The authorities an absolute-form request target may name.
    pub(crate) own_authorities: Vec<String>,
}

impl Admit {
    fn check<B>(&self, req: &Request<B>) -> Result<(), Refusal> {
        if req.method() == Method::CONNECT || req.method() == Method::TRACE {
            return Err(Refusal::MethodNotAllowed(
                "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS",
            ));
        }
        if let Some(authority) = req.uri().authority()
            && !self
                .own_authorities
                .iter()
                .any(|a| a.eq_ignore_ascii_case(authority.as_str()))
        {
            return Err(Refusal::ForeignAuthority);
        }
        check_path(req.uri().path())
    }
}

impl<B: Send + 'static> Phase<B> for Admit {
    type Out = B;

    fn run(self: &Arc<Self>, req: Request<B>) -> Decision<B> {
        Decision::Now(self.check(&req).map(|()| Step::next(req)))
    }
}

/// The authorities an absolute-form request target may name: the bound
/// address, and `localhost` on its port.
pub(crate) fn own_authorities(addr: std::net::SocketAddr) -> Vec<String> {
    let mut out = vec![addr.to_string(), format!("localhost:{}", addr.port())];
    if addr.ip().is_unspecified() {
        out.push(format!("127.0.0.1:{}", addr.port()));
        out.push(format!("[::1]:{}", addr.port()));
    }
    out
}

/// Refuses a path an upstream could resolve outside the route's base:
/// dot segments (`.`, `..`, also percent-encoded, any case), empty
/// segments (`//`; one trailing `/` is kept), backslashes and encoded
/// slashes or backslashes.
pub(crate) fn check_path(path: &str) -> Result<(), Refusal> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(Refusal::BadPath);
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok(());
    }
    // Byte by byte, without a lowercased or decoded copy: every request
    // passes here.
    for segment in rest.split('/').map(str::as_bytes) {
        if segment.is_empty() || segment.contains(&b'\\') {
            return Err(Refusal::BadPath);
        }
        let encoded_slash = segment.windows(3).any(|w| {
            w[0] == b'%'
                && matches!(
                    (w[1], w[2].to_ascii_lowercase()),
                    (b'2', b'f') | (b'5', b'c')
                )
        });
        if encoded_slash || matches!(dots(segment), Some(1 | 2)) {
            return Err(Refusal::BadPath);
        }
    }
    Ok(())
}

/// How many dots `segment` is when it is nothing else (each `.` or `%2e`
/// in any case), else `None`.
fn dots(segment: &[u8]) -> Option<usize> {
    let mut rest = segment;
    let mut n = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', e, tail @ ..] if e.eq_ignore_ascii_case(&b'e') => tail,
            _ => return None,
        };
        n += 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_a_base_are_refused() {
        for bad in [
            "/v1/../admin",
            "/v1/./chat",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2e/admin",
            "/v1/.%2E/admin",
            "/v1/%2e/x",
            "/..",
            "/v1//chat",
            "//v1",
            "/v1\\..\\x",
            "/v1/a%2fb",
            "/v1/a%5Cb",
            "v1/chat",
        ] {
            assert_eq!(check_path(bad), Err(Refusal::BadPath), "{bad}");
        }
        for good in [
            "/",
            "/v1/chat/completions",
            "/v1/models/",
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
            "/v1/files/file...x",
            "/v1/a%20b",
        ] {
            assert_eq!(check_path(good), Ok(()), "{good}");
        }
    }

    /// The rule as it was first written (lowercased and decoded copies),
    /// which the byte-by-byte one must agree with.
    fn by_copies(path: &str) -> Result<(), Refusal> {
        let Some(rest) = path.strip_prefix('/') else {
            return Err(Refusal::BadPath);
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Ok(());
        }
        for segment in rest.split('/') {
            if segment.is_empty() || segment.contains('\\') {
                return Err(Refusal::BadPath);
            }
            let lower = segment.to_ascii_lowercase();
            if lower.contains("%2f") || lower.contains("%5c") {
                return Err(Refusal::BadPath);
            }
            let decoded = lower.replace("%2e", ".");
            if decoded == "." || decoded == ".." {
                return Err(Refusal::BadPath);
            }
        }
        Ok(())
    }

    #[test]
    fn every_short_path_of_the_telling_characters_is_judged_as_by_copies() {
        const ALPHABET: &[u8] = b"/.%2eEfF5cC\\a";
        let mut paths = vec![String::new()];
        let mut checked = 0;
        for _ in 0..6 {
            let mut longer = Vec::new();
            for p in &paths {
                for &c in ALPHABET {
                    let mut q = p.clone();
                    q.push(char::from(c));
                    assert_eq!(check_path(&q), by_copies(&q), "{q:?}");
                    checked += 1;
                    longer.push(q);
                }
            }
            paths = longer;
        }
        assert!(checked > 1_000_000);
    }
}
