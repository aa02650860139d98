//! Failure evidence: what went wrong with one attempt, where, and what the
//! server said about retrying it.
//!
//! A [`Failure`] is plain data that drivers fill from what they saw (an I/O
//! error kind, a status and its headers, the observer's evidence). It never
//! holds body text, header values or error messages; those stay in the
//! driver's sensitive evidence, reachable only through `inspect_*`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::progress::{Progress, ProviderError, Transience, UnsuccessfulReason};
pub use crate::retry_after::RetryAfter;

/// The broad family of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Category {
    /// Connect, reset, EOF: the connection failed.
    Transport,
    /// The server answered with an unsuccessful status.
    Http,
    /// The provider reported an error in a successful response.
    ProviderResponse,
    /// The stream violated its protocol (malformed, too long, spliced).
    Protocol,
    /// The caller cancelled.
    Cancellation,
    /// A client-side timer fired (head timeout, stall watchdog).
    ClientTimeout,
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Category::Transport => "transport",
            Category::Http => "http",
            Category::ProviderResponse => "provider_response",
            Category::Protocol => "protocol",
            Category::Cancellation => "cancellation",
            Category::ClientTimeout => "client_timeout",
        })
    }
}

/// Where in the exchange a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Phase {
    /// Before the connection was established.
    Connecting,
    /// While writing the request.
    Sending,
    /// Request sent, no response head yet.
    AwaitingHeaders,
    /// Reading the response body.
    Streaming,
    /// Decoding the body (protocol evidence).
    Decoding,
    /// The driver cannot tell (fetch hides connect/send/await).
    Unknown,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Connecting => "connecting",
            Phase::Sending => "sending",
            Phase::AwaitingHeaders => "awaiting_headers",
            Phase::Streaming => "streaming",
            Phase::Decoding => "decoding",
            Phase::Unknown => "unknown",
        })
    }
}

/// Whether the server may have accepted (and started working on) the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Acceptance {
    /// The request never reached the application (connect refused,
    /// `REFUSED_STREAM`).
    No,
    /// The server answered (a status or a body).
    Yes,
    /// Sent, but no head came back: the remote may already be generating.
    Unknown,
}

/// Which stall watchdog (or head timer) fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Stall {
    /// No response head in time.
    Head,
    /// No byte for the idle timeout.
    Idle,
    /// No semantic fragment for the progress timeout (keepalives do not count).
    Progress,
    /// No semantic fragment within the first-token timeout after the head,
    /// before commit.
    FirstToken,
}

/// Kinds of transport failure a driver can tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TransportKind {
    /// Name resolution failed.
    Dns,
    /// The peer refused the connection.
    Refused,
    /// The connection was reset.
    Reset,
    /// The connection closed before the message was complete.
    Closed,
    /// The server refused the stream before processing it (HTTP/2
    /// `REFUSED_STREAM`, `GOAWAY` below our stream).
    RefusedStream,
    /// TLS certificate verification failed: a configuration error, permanent.
    Tls,
    /// Anything else the driver reports as an I/O failure.
    Other,
}

/// Protocol violations the decoders report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Violation {
    /// A line or event over the configured cap.
    LineTooLong,
    /// Malformed JSON or invalid UTF-8 in an event.
    Malformed,
    /// A second `message_start` with a different id.
    SplicedMessage,
    /// A 2xx with a content type that is not the stream that was asked for.
    UnexpectedContentType,
    /// Events in an impossible order.
    Sequence,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Violation::LineTooLong => "line_too_long",
            Violation::Malformed => "malformed",
            Violation::SplicedMessage => "spliced_message",
            Violation::UnexpectedContentType => "unexpected_content_type",
            Violation::Sequence => "sequence",
        })
    }
}

impl From<crate::wire::ProtocolViolation> for Violation {
    /// The failure family of a decoder's typed violation.
    fn from(v: crate::wire::ProtocolViolation) -> Self {
        use crate::wire::ProtocolViolation as P;
        match v {
            P::LineTooLong { .. } | P::EventTooLarge { .. } => Violation::LineTooLong,
            P::SplicedMessage => Violation::SplicedMessage,
            P::TooManyParallelItems => Violation::Sequence,
            P::MalformedJson | P::InvalidUtf8 | P::UnexpectedShape => Violation::Malformed,
        }
    }
}

/// The unfinished frame an attempt ended inside, however it ended (a clean
/// end, a reset, a stall).
///
/// One rule judges it (AT3): it blocks a replay when its bytes show, or may
/// show, a semantic fragment begun (a content, reasoning, refusal or tool
/// field whose value has started, or anything the scan cannot rule out);
/// bytes that provably hold none (`data: {`, a frame cut before any
/// semantic value began, an unfinished keepalive) do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Unfinished {
    /// Bytes of the unfinished frame (0: the attempt ended between frames).
    pub bytes: u64,
    /// Those bytes show, or may show, a semantic fragment begun.
    pub may_be_semantic: bool,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum FailureKind {
    /// The connection failed.
    Transport {
        /// How.
        transport: TransportKind,
    },
    /// The server answered with a non-success status.
    Status {
        /// The status code.
        status: u16,
    },
    /// The server redirected; redirects are never followed inside recovery.
    Redirect {
        /// The 3xx status.
        status: u16,
    },
    /// The provider reported an error (in-stream, or in an error body).
    Provider {
        /// The classified error.
        error: ProviderError,
    },
    /// The body ended cleanly without terminal proof.
    UnexpectedEof,
    /// The generation ended by the provider's decision.
    Unsuccessful {
        /// Why.
        reason: UnsuccessfulReason,
    },
    /// The stream broke its protocol.
    Protocol {
        /// How.
        violation: Violation,
    },
    /// A client timer fired.
    Timeout {
        /// Which.
        stall: Stall,
    },
    /// A wire observer hook refused the exchange.
    ObserverRejected,
    /// The inner service's readiness failed.
    NotReady,
}

/// Evidence of one failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Failure {
    /// What went wrong.
    pub kind: FailureKind,
    /// Where.
    pub phase: Phase,
    /// Whether the server may have accepted the request.
    pub acceptance: Acceptance,
    /// The response status, when a head was received.
    pub status: Option<u16>,
    /// The server's `Retry-After` hint.
    pub retry_after: RetryAfter,
    /// The server's `x-should-retry` header.
    pub should_retry: Option<bool>,
    /// Progress of the failed attempt.
    pub progress: Progress,
    /// The frame the attempt ended inside, if any.
    #[serde(default)]
    pub unfinished: Unfinished,
}

impl Failure {
    /// A failure of `kind` in `phase`, acceptance inferred from the phase.
    pub fn new(kind: FailureKind, phase: Phase) -> Self {
        let acceptance = match (&kind, phase) {
            (
                FailureKind::Transport {
                    transport:
                        TransportKind::Dns
                        | TransportKind::Refused
                        | TransportKind::RefusedStream
                        | TransportKind::Tls,
                },
                _,
            )
            | (_, Phase::Connecting) => Acceptance::No,
            (FailureKind::Transport { .. } | FailureKind::Timeout { .. }, _)
                if matches!(
                    phase,
                    Phase::Sending | Phase::AwaitingHeaders | Phase::Unknown
                ) =>
            {
                Acceptance::Unknown
            }
            _ => Acceptance::Yes,
        };
        Failure {
            kind,
            phase,
            acceptance,
            status: None,
            retry_after: RetryAfter::Absent,
            should_retry: None,
            progress: Progress::default(),
            unfinished: Unfinished::default(),
        }
    }

    /// A transport failure.
    pub fn transport(transport: TransportKind, phase: Phase) -> Self {
        Failure::new(FailureKind::Transport { transport }, phase)
    }

    /// An unsuccessful status with its server hints.
    pub fn status(status: u16, retry_after: RetryAfter, should_retry: Option<bool>) -> Self {
        let kind = if (300..400).contains(&status) {
            FailureKind::Redirect { status }
        } else {
            FailureKind::Status { status }
        };
        let mut f = Failure::new(kind, Phase::AwaitingHeaders);
        f.acceptance = if status == 504 {
            // A proxy's 504: the request may still be running upstream.
            Acceptance::Unknown
        } else {
            Acceptance::Yes
        };
        f.status = Some(status);
        f.retry_after = retry_after;
        f.should_retry = should_retry;
        f
    }

    /// Sets the attempt's progress.
    #[must_use]
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Sets the unfinished frame the attempt ended inside.
    #[must_use]
    pub fn with_unfinished(mut self, unfinished: Unfinished) -> Self {
        self.unfinished = unfinished;
        self
    }

    /// Whether the attempt's evidence shows, or may show, semantic output:
    /// an observed or delivered fragment, or an unfinished frame that may
    /// hold one. Such an attempt is never replayed.
    pub fn shows_output(&self) -> bool {
        self.progress.blocks_replay() || self.unfinished.may_be_semantic
    }

    /// Whether the provider said the prompt is longer than the target's
    /// context window (the code `context_length_exceeded`).
    pub fn is_context_overflow(&self) -> bool {
        matches!(&self.kind, FailureKind::Provider { error }
            if error.code.as_ref().is_some_and(|c| c.as_str() == crate::safe::CONTEXT_LENGTH_EXCEEDED))
    }

    /// Sets the status the failure came with (e.g. an in-stream error in a 200).
    #[must_use]
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// The failure's category.
    pub fn category(&self) -> Category {
        match &self.kind {
            FailureKind::Transport { .. } | FailureKind::UnexpectedEof => Category::Transport,
            FailureKind::Status { .. } | FailureKind::Redirect { .. } => Category::Http,
            FailureKind::Provider { .. } | FailureKind::Unsuccessful { .. } => {
                Category::ProviderResponse
            }
            FailureKind::Protocol { .. }
            | FailureKind::ObserverRejected
            | FailureKind::NotReady => Category::Protocol,
            FailureKind::Timeout { .. } => Category::ClientTimeout,
        }
    }

    /// Whether the failure can never be fixed by a resend, whatever the
    /// policy says (and if so, why).
    pub fn permanent_cause(&self) -> Option<PermanentCause> {
        match &self.kind {
            FailureKind::Transport {
                transport: TransportKind::Tls,
            } => Some(PermanentCause::Tls),
            FailureKind::Redirect { status } => Some(PermanentCause::Redirect { status: *status }),
            FailureKind::Status { status } => (NEVER_RETRYABLE.contains(status)
                || (400..500).contains(status) && !matches!(status, 408 | 409 | 429))
            .then_some(PermanentCause::Status { status: *status }),
            FailureKind::Provider { error } if error.transience == Transience::Permanent => {
                Some(PermanentCause::Provider {
                    code: error.code.clone(),
                })
            }
            FailureKind::Unsuccessful { reason } => Some(PermanentCause::Unsuccessful {
                reason: reason.clone(),
            }),
            FailureKind::Protocol { violation } => Some(PermanentCause::Protocol {
                violation: *violation,
            }),
            FailureKind::ObserverRejected => Some(PermanentCause::ObserverRejected),
            FailureKind::NotReady => Some(PermanentCause::NotReady),
            _ => None,
        }
    }
}

/// Statuses that can never be retried, whatever the caller selects:
/// bad request, unauthorized, forbidden, not found, too large, unprocessable.
pub const NEVER_RETRYABLE: &[u16] = &[400, 401, 403, 404, 413, 422];

/// Why a failure is permanent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cause")]
#[non_exhaustive]
pub enum PermanentCause {
    /// A status that a resend cannot fix.
    Status {
        /// The status.
        status: u16,
    },
    /// A redirect, never followed.
    Redirect {
        /// The 3xx status.
        status: u16,
    },
    /// A TLS configuration error.
    Tls,
    /// A permanent provider error.
    Provider {
        /// The allowlisted code, if any.
        code: Option<crate::safe::SafeToken>,
    },
    /// An unsuccessful terminal.
    Unsuccessful {
        /// Why.
        reason: UnsuccessfulReason,
    },
    /// A protocol violation.
    Protocol {
        /// How.
        violation: Violation,
    },
    /// The wire observer hook refused.
    ObserverRejected,
    /// The inner service failed its readiness check.
    NotReady,
    /// The server vetoed retries (`x-should-retry: false`).
    ServerVetoed,
}

impl fmt::Display for PermanentCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PermanentCause::Status { status } => write!(f, "status {status}"),
            PermanentCause::Redirect { status } => write!(f, "redirect {status}, not followed"),
            PermanentCause::Tls => f.write_str("TLS error"),
            PermanentCause::Provider { code: Some(code) } => write!(f, "provider error {code}"),
            PermanentCause::Provider { code: None } => f.write_str("provider error"),
            PermanentCause::Unsuccessful { reason } => {
                write!(f, "unsuccessful terminal {reason:?}")
            }
            PermanentCause::Protocol { violation } => write!(f, "protocol violation {violation}"),
            PermanentCause::ObserverRejected => f.write_str("the wire observer refused"),
            PermanentCause::NotReady => f.write_str("the inner service was not ready"),
            PermanentCause::ServerVetoed => f.write_str("the server vetoed retries"),
        }
    }
}
