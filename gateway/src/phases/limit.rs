//! The concurrency limit: a slot per forwarded request, taken at once or
//! refused (`503`, `retry-after: 1`: load is shed, never queued), and held
//! from the request head to the end of the client's read, so a client that
//! trickles its body or stops reading holds it only as long as its own
//! deadlines allow. A generation kept going after its client left holds a
//! place of the keep-generating pool instead (`downstream`), and a
//! tunnel keeps its slot until it closes (`tunnel`).

use std::sync::Arc;

use http::Request;
use tokio::sync::Semaphore;

use crate::metrics::Metrics;
use crate::phase::{Decision, Phase, Step};
use crate::respond::Refusal;
use crate::tunnel::TunnelSlot;

/// The limit phase.
pub(crate) struct Limit {
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) metrics: Arc<Metrics>,
}

impl<B: Send + 'static> Phase<B> for Limit {
    type Out = B;

    fn run(self: &Arc<Self>, req: Request<B>) -> Decision<B> {
        let step = if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            if crate::tunnel::wanted(req.headers()).is_some() {
                // A tunnel's response ends with the switch; the tunnel
                // keeps the slot for its life.
                let mut req = req;
                req.extensions_mut().insert(TunnelSlot::new(slot));
                Ok(Step::next(req))
            } else {
                Ok(Step::Next {
                    req,
                    hold: Some(Box::new(slot)),
                })
            }
        } else {
            self.metrics.rejected();
            Err(Refusal::TooManyStreams)
        };
        Decision::Now(step)
    }
}
