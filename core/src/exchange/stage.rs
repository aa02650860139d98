//! Where the request is between its inputs: about to send, with an
//! attempt in flight, waiting, parked offline, asking a hook, or ended.

use super::attempt::Phase as AttemptPhase;
use super::io::AdmissionRequest;
use crate::decision::AdmissionAnswer;
use crate::failure::Failure;
use crate::outcome::{CancelPhase, Outcome};

#[cfg(doc)]
use super::timers::Timers;

/// Where the request is; the timers each stage arms are in [`Timers`].
#[derive(Debug)]
pub(super) enum Stage {
    /// The next send is due; `resume` when it is a resume whose wait
    /// ended, which goes only when online (reliability matrix AD5).
    ToSend { resume: bool },
    /// An attempt is on its way or being read ([`Attempt`]'s phase says
    /// where).
    InFlight,
    /// A wait before the next send (a resume's, when `resume`).
    Waiting { resume: bool },
    /// Offline; `then_send` when the resume is due as soon as it is back.
    Parked { then_send: bool },
    /// The attempt failed: what follows is decided at the next poll, with
    /// connectivity.
    Failed(Box<Failure>),
    /// Waiting for the admission hook (the question, until asked; the
    /// answer, until decided at the next poll).
    Admission {
        request: Option<Box<AdmissionRequest>>,
        answer: Option<AdmissionAnswer>,
    },
    /// Waiting for the continuation hook's answer (until decided at the
    /// next poll).
    Continuation {
        failure: Box<Failure>,
        given: Option<bool>,
    },
    /// The request ended: the body's clean end, or its typed outcome.
    Ended(Result<(), Outcome>),
}

/// What a stage holds for the next poll to decide, with connectivity.
pub(super) enum Pending {
    /// The attempt's failure.
    Failure(Box<Failure>),
    /// The admission hook's answer.
    Admission(AdmissionAnswer),
    /// The continuation hook's answer (`true`: it gave one) to the failure
    /// it was asked about.
    Continuation(Box<Failure>, bool),
}

impl Stage {
    /// Takes what waits for a decision, if anything does: a failed
    /// attempt leaves the stage to the decision, an answered hook its
    /// question.
    pub(super) fn take_pending(&mut self) -> Option<Pending> {
        match self {
            Stage::Admission { answer, .. } => answer.take().map(Pending::Admission),
            Stage::Failed(_) | Stage::Continuation { given: Some(_), .. } => {
                match std::mem::replace(self, Stage::ToSend { resume: false }) {
                    Stage::Failed(failure) => Some(Pending::Failure(failure)),
                    Stage::Continuation {
                        failure,
                        given: Some(given),
                    } => Some(Pending::Continuation(failure, given)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The phase a cancellation now is in (`sent`: a send went out
    /// before); `None` when the request has ended. An attempt that failed
    /// and awaits its decision has its failure decided first.
    pub(super) fn cancel_phase(&self, attempt: &AttemptPhase, sent: bool) -> Option<CancelPhase> {
        Some(match (self, attempt) {
            (Stage::Ended(_) | Stage::Failed(_), _) => return None,
            (Stage::ToSend { .. }, _) if !sent => CancelPhase::Sending,
            (Stage::ToSend { .. } | Stage::Waiting { .. } | Stage::Continuation { .. }, _) => {
                CancelPhase::Waiting
            }
            (Stage::InFlight, AttemptPhase::Sending) => CancelPhase::Sending,
            (Stage::InFlight, AttemptPhase::AwaitingHead) => CancelPhase::AwaitingHead,
            (Stage::InFlight, _) => CancelPhase::Streaming,
            (Stage::Parked { .. }, _) => CancelPhase::Parked,
            (Stage::Admission { .. }, _) => CancelPhase::Admission,
        })
    }
}
