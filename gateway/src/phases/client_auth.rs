//! With `[[clients]]`, a known client key on every request but
//! `GET /healthz` ([`Clients::check`]); the request then carries whose
//! credentials it goes upstream with ([`Credentials`], in its extensions).

use std::sync::Arc;

use http::Request;

use crate::auth::{Clients, Credentials};
use crate::phase::{Decision, Phase, Step};

/// The client-key phase.
pub(crate) struct ClientAuth(pub(crate) Clients);

impl<B: Send + 'static> Phase<B> for ClientAuth {
    type Out = B;

    fn run(self: &Arc<Self>, mut req: Request<B>) -> Decision<B> {
        let checked = if req.uri().path() == "/healthz" {
            Ok(Step::next(req))
        } else {
            self.0.check(req.headers()).map(|credentials: Credentials| {
                req.extensions_mut().insert(credentials);
                Step::next(req)
            })
        };
        Decision::Now(checked)
    }
}
