//! Where a request goes: the longest matching route prefix, else the
//! default upstream, and which protocol its answer speaks.

use http::{HeaderMap, HeaderName, Uri};
use recovery_core::protocol::{ProtocolChoice, ProtocolKind};

use crate::config::{Declared, Http2, Route, RouteProtocol};

/// The upstream of one request.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The URL to send to (query kept).
    pub(crate) uri: Uri,
    /// The protocol its answer is decoded as.
    pub(crate) protocol: ProtocolKind,
    /// Whether its streams are resumable (ids, log).
    pub(crate) resumable: bool,
    /// The operator's headers for this upstream (credentials).
    pub(crate) headers: HeaderMap,
    /// The HTTP version its sends may use.
    pub(crate) http2: Http2,
    /// What it declares about its model.
    pub(crate) declared: Declared,
}

/// The routing table.
#[derive(Debug, Clone)]
pub(crate) struct Router {
    /// Longest prefix first.
    routes: Vec<Route>,
    default: Option<Uri>,
    default_headers: HeaderMap,
    default_http2: Http2,
    default_declared: Declared,
    /// The credential headers routes name, beside the usual ones.
    credential_headers: Vec<HeaderName>,
}

impl Router {
    pub(crate) fn new(
        mut routes: Vec<Route>,
        default: Option<Uri>,
        default_headers: HeaderMap,
        default_http2: Http2,
        default_declared: Declared,
    ) -> Self {
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        let mut credential_headers: Vec<HeaderName> = routes
            .iter()
            .filter_map(|r| r.credential_header.clone())
            .collect();
        credential_headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        credential_headers.dedup();
        Router {
            routes,
            default,
            default_headers,
            default_http2,
            default_declared,
            credential_headers,
        }
    }

    /// The credential headers routes name (a stream's owner includes them).
    pub(crate) fn credential_header(&self) -> &[HeaderName] {
        &self.credential_headers
    }

    fn matches(prefix: &str, path: &str) -> bool {
        prefix == "/"
            || path == prefix
            || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
    }

    /// The target of a request to `path` (and `query`), or `None` when no
    /// route matches and there is no default upstream.
    pub(crate) fn target(&self, path: &str, query: Option<&str>) -> Option<Target> {
        let (base, rest, protocol, resumable, headers, http2, declared) =
            match self.routes.iter().find(|r| Self::matches(&r.prefix, path)) {
                Some(r) => {
                    let rest = if r.strip_prefix && r.prefix != "/" {
                        &path[r.prefix.len()..]
                    } else {
                        path
                    };
                    (
                        &r.upstream,
                        rest,
                        &r.protocol,
                        r.resumable,
                        &r.headers,
                        r.http2,
                        r.declared,
                    )
                }
                None => (
                    self.default.as_ref()?,
                    path,
                    &RouteProtocol::Auto,
                    true,
                    &self.default_headers,
                    self.default_http2,
                    self.default_declared,
                ),
            };
        let base_path = base.path().trim_end_matches('/');
        let rest = if rest.is_empty() { "/" } else { rest };
        let mut path_and_query = format!("{base_path}{rest}");
        if let Some(q) = query {
            path_and_query.push('?');
            path_and_query.push_str(q);
        }
        let uri = Uri::builder()
            .scheme(base.scheme_str()?)
            .authority(base.authority()?.as_str())
            .path_and_query(path_and_query.as_str())
            .build()
            .ok()?;
        let protocol = match protocol {
            RouteProtocol::Auto => ProtocolChoice::Auto.resolve(&path_and_query),
            RouteProtocol::Fixed(k) => k.clone(),
        };
        Some(Target {
            uri,
            protocol,
            resumable,
            headers: headers.clone(),
            http2,
            declared,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(prefix: &str, up: &str, strip: bool, p: RouteProtocol) -> Route {
        Route {
            prefix: prefix.into(),
            upstream: up.parse().unwrap(),
            strip_prefix: strip,
            protocol: p,
            resumable: true,
            headers: HeaderMap::new(),
            credential_header: None,
            http2: Http2::Off,
            declared: Declared::default(),
        }
    }

    #[test]
    fn longest_prefix_wins_and_strips() {
        let r = Router::new(
            vec![
                route("/a", "http://one:1", true, RouteProtocol::Auto),
                route(
                    "/a/b",
                    "http://two:2/base/",
                    true,
                    RouteProtocol::Fixed(ProtocolKind::Gemini),
                ),
            ],
            Some("https://default".parse().unwrap()),
            HeaderMap::new(),
            Http2::Off,
            Declared::default(),
        );
        let t = r.target("/a/b/x", Some("k=1")).unwrap();
        assert_eq!(t.uri.to_string(), "http://two:2/base/x?k=1");
        assert_eq!(t.protocol, ProtocolKind::Gemini);
        let t = r.target("/a/v1/messages", None).unwrap();
        assert_eq!(t.uri.to_string(), "http://one:1/v1/messages");
        assert_eq!(t.protocol, ProtocolKind::Anthropic);
        let t = r.target("/ab/v1/responses", None).unwrap();
        assert_eq!(t.uri.to_string(), "https://default/ab/v1/responses");
        assert_eq!(t.protocol, ProtocolKind::OpenAiResponses);
        assert_eq!(
            r.target("/a", None).unwrap().uri.to_string(),
            "http://one:1/"
        );
        assert!(
            Router::new(
                vec![],
                None,
                HeaderMap::new(),
                Http2::Off,
                Declared::default()
            )
            .target("/x", None)
            .is_none()
        );
    }
}
