//! The machine's steps as numbers, for the modules that run it under a
//! shell in another language (the npm package's wasm module, the Python
//! extension). A shell switches on the `u32` every input returns, so the
//! numbering is one contract between a module and its shell, kept here
//! once for every module.

use bytes::Bytes;

use super::io::{Io, Send};

/// Action codes: the low byte of what a module's input returns, and the
/// flags above it.
pub mod action {
    /// Send a request.
    pub const SEND: u32 = 1;
    /// Await the response head.
    pub const AWAIT_HEAD: u32 = 2;
    /// Read the next chunk.
    pub const READ: u32 = 3;
    /// Release the attempt's response.
    pub const RELEASE: u32 = 4;
    /// Respond with the committed head.
    pub const RESPOND: u32 = 5;
    /// Respond with the final HTTP error.
    pub const RESPOND_ERROR: u32 = 6;
    /// Deliver a chunk.
    pub const DELIVER: u32 = 7;
    /// Sleep until the deadline.
    pub const SLEEP: u32 = 8;
    /// Wait until online.
    pub const WAIT_ONLINE: u32 = 9;
    /// Ask the admission hook.
    pub const ASK_ADMISSION: u32 = 10;
    /// Await the admission hook's answer.
    pub const AWAIT_ADMISSION: u32 = 11;
    /// Ask the continuation hook.
    pub const ASK_CONTINUATION: u32 = 12;
    /// The request completed.
    pub const END_OK: u32 = 13;
    /// The request failed.
    pub const END_ERR: u32 = 14;
    /// Send a hedge (the original request to the hedge's target).
    pub const HEDGE: u32 = 15;
    /// Two attempts race: await either's news.
    pub const RACE: u32 = 16;
    /// Release the hedge's response.
    pub const RELEASE_HEDGE: u32 = 17;
    /// The hedge takes the first attempt's place.
    pub const PROMOTE: u32 = 18;
    /// Hand the chunk just given to the consumer first.
    pub const DELIVER_THIS: u32 = 0x100;
    /// Lifecycle events are waiting.
    pub const EVENTS: u32 = 0x200;
    /// The deadline moved.
    pub const DEADLINE: u32 = 0x400;
}

impl<C> Io<C> {
    /// This step's action code ([`action`]).
    pub fn action(&self) -> u32 {
        match self {
            Io::Send(_) => action::SEND,
            Io::AwaitHead => action::AWAIT_HEAD,
            Io::Read => action::READ,
            Io::Release => action::RELEASE,
            Io::Hedge { .. } => action::HEDGE,
            Io::Race => action::RACE,
            Io::ReleaseHedge => action::RELEASE_HEDGE,
            Io::Promote => action::PROMOTE,
            Io::Respond => action::RESPOND,
            Io::RespondError => action::RESPOND_ERROR,
            Io::Deliver(_) => action::DELIVER,
            Io::Sleep => action::SLEEP,
            Io::WaitOnline => action::WAIT_ONLINE,
            Io::AskAdmission(_) => action::ASK_ADMISSION,
            Io::AwaitAdmission => action::AWAIT_ADMISSION,
            Io::AskContinuation => action::ASK_CONTINUATION,
            Io::End(Ok(())) => action::END_OK,
            Io::End(Err(_)) => action::END_ERR,
        }
    }
}

/// A send as a shell makes it: which request, and for a resume or a
/// prefill continuation what differs from the original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// 0 the original request, 1 a resume, 2 the continuation, 3 a
    /// prefill continuation.
    pub kind: u32,
    /// A resume's URL (empty otherwise: the request's).
    pub url: String,
    /// A resume's method (empty otherwise: the request's).
    pub method: String,
    /// A resume's header (`Last-Event-ID` and the cursor).
    pub header: Option<(&'static str, String)>,
    /// Whether the original body goes with it (a resume may go without).
    pub with_body: bool,
    /// The body the machine wrote (a prefill continuation; empty
    /// otherwise). A shell takes it once.
    pub body: Bytes,
}

impl From<Send> for Outgoing {
    fn from(send: Send) -> Self {
        let plain = |kind| Outgoing {
            kind,
            url: String::new(),
            method: String::new(),
            header: None,
            with_body: true,
            body: Bytes::new(),
        };
        match send {
            Send::Original => plain(0),
            Send::Resume(r) => Outgoing {
                url: r.url,
                method: r.method,
                header: r.header,
                with_body: r.with_body,
                ..plain(1)
            },
            Send::Continuation => plain(2),
            Send::Prefill(body) => Outgoing { body, ..plain(3) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_has_its_own_code_below_the_flags() {
        let steps: Vec<Io<()>> = vec![
            Io::Send(Send::Original),
            Io::AwaitHead,
            Io::Read,
            Io::Release,
            Io::Respond,
            Io::RespondError,
            Io::Deliver(super::super::io::Chunk::Made(bytes::Bytes::new())),
            Io::Sleep,
            Io::WaitOnline,
            Io::AwaitAdmission,
            Io::AskContinuation,
            Io::End(Ok(())),
            Io::End(Err(crate::outcome::Outcome::AdmissionRequired)),
            Io::Hedge { target: 1 },
            Io::Race,
            Io::ReleaseHedge,
            Io::Promote,
        ];
        let mut codes: Vec<u32> = steps.iter().map(Io::action).collect();
        codes.push(action::ASK_ADMISSION);
        codes.sort_unstable();
        assert_eq!(codes, (1..=18).collect::<Vec<_>>());
        for flag in [action::DELIVER_THIS, action::EVENTS, action::DEADLINE] {
            assert_eq!(flag & 0xff, 0);
        }
    }

    #[test]
    fn a_send_tells_a_shell_what_differs_from_the_original() {
        let resume = crate::resume::ResumeRequest {
            method: "GET".into(),
            url: "https://api.openai.com/v1/responses/resp_1?stream=true".into(),
            header: None,
            with_body: false,
        };
        let out = Outgoing::from(Send::Resume(resume));
        assert_eq!(
            (out.kind, out.method.as_str(), out.with_body),
            (1, "GET", false)
        );
        assert!(out.url.ends_with("resp_1?stream=true"));
        let prefill = Outgoing::from(Send::Prefill(Bytes::from_static(b"{}")));
        assert_eq!((prefill.kind, &prefill.body[..]), (3, &b"{}"[..]));
        for (send, kind) in [(Send::Original, 0), (Send::Continuation, 2)] {
            let out = Outgoing::from(send);
            assert_eq!(out.kind, kind);
            assert!(out.url.is_empty() && out.with_body && out.body.is_empty());
        }
    }
}
