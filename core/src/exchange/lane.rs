//! What one attempt holds as its own: the send and its answer, what it has
//! for the driver and the consumer, its timers, the protocol its answer is
//! read as, and how its stream could be continued once committed. A request
//! has one lane; while a hedge races it ([`super::race`]), two, and
//! whichever wins is the request's from then on.

use super::attempt::Attempt;
use super::outbox::Outbox;
use super::resumption::Resumption;
use super::timers::Timers;
use crate::protocol::ProtocolKind;

/// One attempt's own state. See the module docs.
#[derive(Debug)]
pub(super) struct Lane<C, D> {
    /// The attempt in flight (or the last one).
    pub(super) attempt: Attempt<D>,
    /// What is due to the driver and the consumer.
    pub(super) outbox: Outbox<C>,
    pub(super) timers: Timers,
    /// The protocol the answer is decoded as.
    pub(super) protocol: ProtocolKind,
    /// How a committed stream can be continued, when it can.
    pub(super) resumption: Option<Box<Resumption>>,
}
