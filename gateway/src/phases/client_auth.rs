//! With `[[clients]]`, a known client key on every request but
//! `GET /healthz` ([`Clients::check`]); the request then carries whose
//! credentials it goes upstream with ([`Credentials`], in its extensions).
//!
//! A browser's CORS preflight carries no credentials (the fetch standard
//! sends none), so a keyed gateway answers it itself, as the providers do:
//! any origin, the method and headers asked for. That lets a browser reach
//! the keyed request, which is checked like any other; the key is the
//! access control, and no cookie or other ambient authority rides along.
//! Without `[[clients]]` a preflight goes upstream like any request.

use std::sync::Arc;

use http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD,
    HeaderValue, ORIGIN, VARY,
};
use http::{Method, Request, Response, StatusCode};

use crate::auth::{Clients, Credentials};
use crate::body::{GatewayBody, full};
use crate::phase::{Decision, Phase, Step};

/// The client-key phase.
pub(crate) struct ClientAuth(pub(crate) Clients);

impl<B: Send + 'static> Phase<B> for ClientAuth {
    type Out = B;

    fn run(self: &Arc<Self>, mut req: Request<B>) -> Decision<B> {
        let checked = if req.uri().path() == "/healthz" {
            Ok(Step::next(req))
        } else if self.0.enabled()
            && let Some(answer) = preflight(&req)
        {
            Ok(Step::Answer(answer))
        } else {
            self.0.check(req.headers()).map(|credentials: Credentials| {
                req.extensions_mut().insert(credentials);
                Step::next(req)
            })
        };
        Decision::Now(checked)
    }
}

/// How long a browser may keep a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE: HeaderValue = HeaderValue::from_static("600");

/// The answer to `req` if it is a CORS preflight (`OPTIONS` with an
/// `Origin` and an `Access-Control-Request-Method`): `204`, allowing the
/// origin, the method and the headers it asks for.
fn preflight<B>(req: &Request<B>) -> Option<Response<GatewayBody>> {
    let h = req.headers();
    if req.method() != Method::OPTIONS {
        return None;
    }
    let origin = h.get(ORIGIN)?.clone();
    let method = h.get(ACCESS_CONTROL_REQUEST_METHOD)?.clone();
    let mut resp = Response::new(full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    let out = resp.headers_mut();
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    out.insert(ACCESS_CONTROL_ALLOW_METHODS, method);
    if let Some(asked) = h.get(ACCESS_CONTROL_REQUEST_HEADERS) {
        out.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    out.insert(ACCESS_CONTROL_MAX_AGE, PREFLIGHT_MAX_AGE);
    out.insert(
        VARY,
        HeaderValue::from_static(
            "origin, access-control-request-method, access-control-request-headers",
        ),
    );
    Some(resp)
}
