//! The per-attempt stream observer: framing plus a provider protocol.
//!
//! A driver creates one [`StreamObserver`] per attempt and feeds it every
//! body read. The observer never changes a byte (the driver forwards the same
//! bytes), processes each read incrementally, and reports what that read
//! changed: the commit point (first semantic event complete), terminal
//! proof, an in-stream provider error. At a clean end of body,
//! [`StreamObserver::finish`] says whether the stream *finished* or merely
//! *ended*.

use memchr::memchr2;
use serde::{Deserialize, Serialize};

use crate::failure::Unfinished;
use crate::progress::{Generation, Proof, UnsuccessfulReason};
use crate::progress::{Progress, ProviderError, ResumeCursor, SemanticKind, Terminal, Usage};
#[cfg(feature = "anthropic")]
use crate::protocol::Anthropic;
#[cfg(feature = "gemini")]
use crate::protocol::Gemini;
#[cfg(feature = "ollama")]
use crate::protocol::Ollama;
#[cfg(feature = "openai-chat")]
use crate::protocol::OpenAiChat;
#[cfg(feature = "openai-responses")]
use crate::protocol::OpenAiResponses;
use crate::protocol::{
    BodyForm, Decode, EventClass, EventInfo, Evidence, Frame, GenericSse, Protocol, ProtocolKind,
    SemanticOptions, classify_json_body, partial_body_may_be_semantic,
};
use crate::wire::{
    Limits, NdjsonDecoder, NdjsonItem, NdjsonSink, SseDecoder, SseItem, SseSink, data_value_start,
};

pub use crate::wire::ProtocolViolation;

/// How an observer is set up for one attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ObserverConfig {
    /// Line and event caps.
    pub limits: Limits,
    /// What counts as semantic.
    pub semantic: SemanticOptions,
    /// For a resumed Responses stream: the last sequence number already
    /// forwarded. Frames at or below it are flagged as duplicates and change
    /// no evidence.
    pub resume_after_sequence: Option<u64>,
    /// Decode every JSON event fully with `serde_json` instead of the fast
    /// scan. Slow; exists so tests can show both agree.
    #[doc(hidden)]
    pub reference_decode: bool,
}

/// One decoded frame, as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct EventRecord {
    /// Class, sequence number and duplicate flag.
    pub info: EventInfo,
    /// Stream offset just past the frame's last byte (its blank line for
    /// SSE, its LF for NDJSON): the commit byte when the frame is the first
    /// semantic one.
    pub end_offset: u64,
}

/// What one read changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Feed {
    /// Frames completed in this read (keepalives included).
    pub frames: u32,
    /// Stream offset past the frame that carried the first semantic (S/X)
    /// output, when that frame completed in this read: the commit point.
    pub committed_at: Option<u64>,
    /// Terminal proof reached in this read.
    pub terminal: Option<Terminal>,
    /// A provider error first seen in this read.
    pub provider_error: Option<ProviderError>,
}

impl Feed {
    /// Whether the first semantic event completed in this read.
    pub fn committed(&self) -> bool {
        self.committed_at.is_some()
    }
}

/// How the body ended, judged at a clean transport EOF.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "end")]
pub enum EndOfStream {
    /// The generation finished normally.
    Success {
        /// Strength of the proof.
        proof: Proof,
    },
    /// The provider ended the generation unsuccessfully.
    Unsuccessful {
        /// Why.
        reason: UnsuccessfulReason,
    },
    /// The provider reported an error inside the stream.
    ProviderError {
        /// The classified error.
        error: ProviderError,
    },
    /// The stream broke its protocol earlier.
    Violation {
        /// Which rule.
        violation: ProtocolViolation,
    },
    /// The body ended without terminal proof: truncation, whatever the
    /// transport said.
    UnexpectedEof {
        /// The frame the body ended inside, if any.
        pending: Option<Unfinished>,
    },
}

#[derive(Debug, Clone)]
enum Framing {
    Sse(SseDecoder),
    Ndjson(NdjsonDecoder),
    /// A non-streamed JSON body, kept whole (capped) until EOF.
    Body(Vec<u8>),
    /// The answer to a request that is not a generation: nothing decoded,
    /// every byte output, the clean end its proof.
    Opaque,
}

#[derive(Debug, Clone)]
enum AnyProtocol {
    #[cfg(feature = "openai-chat")]
    Chat(OpenAiChat),
    #[cfg(feature = "openai-responses")]
    Responses(OpenAiResponses),
    #[cfg(feature = "anthropic")]
    Anthropic(Anthropic),
    #[cfg(feature = "gemini")]
    Gemini(Gemini),
    #[cfg(feature = "ollama")]
    Ollama(Ollama),
    Sse(GenericSse),
}

impl AnyProtocol {
    fn new(kind: &ProtocolKind, semantic: SemanticOptions) -> Self {
        let opaque = semantic.opaque_reasoning_is_semantic;
        match kind {
            #[cfg(feature = "openai-chat")]
            ProtocolKind::OpenAiChat => AnyProtocol::Chat(OpenAiChat::new()),
            #[cfg(feature = "openai-responses")]
            ProtocolKind::OpenAiResponses => AnyProtocol::Responses(OpenAiResponses::new(opaque)),
            #[cfg(feature = "anthropic")]
            ProtocolKind::Anthropic => AnyProtocol::Anthropic(Anthropic::new(opaque)),
            #[cfg(feature = "gemini")]
            ProtocolKind::Gemini => AnyProtocol::Gemini(Gemini::new()),
            #[cfg(feature = "ollama")]
            ProtocolKind::Ollama => AnyProtocol::Ollama(Ollama::new()),
            ProtocolKind::Sse { terminal_sentinel } => {
                AnyProtocol::Sse(GenericSse::new(terminal_sentinel.clone()))
            }
            // A protocol this build leaves out: generic SSE without a
            // terminal, which never proves an end.
            #[allow(unreachable_patterns)]
            _ => AnyProtocol::Sse(GenericSse::new(None)),
        }
    }

    fn get_ref(&self) -> &dyn Protocol {
        match self {
            #[cfg(feature = "openai-chat")]
            AnyProtocol::Chat(p) => p,
            #[cfg(feature = "openai-responses")]
            AnyProtocol::Responses(p) => p,
            #[cfg(feature = "anthropic")]
            AnyProtocol::Anthropic(p) => p,
            #[cfg(feature = "gemini")]
            AnyProtocol::Gemini(p) => p,
            #[cfg(feature = "ollama")]
            AnyProtocol::Ollama(p) => p,
            AnyProtocol::Sse(p) => p,
        }
    }

    fn get(&mut self) -> &mut dyn Protocol {
        match self {
            #[cfg(feature = "openai-chat")]
            AnyProtocol::Chat(p) => p,
            #[cfg(feature = "openai-responses")]
            AnyProtocol::Responses(p) => p,
            #[cfg(feature = "anthropic")]
            AnyProtocol::Anthropic(p) => p,
            #[cfg(feature = "gemini")]
            AnyProtocol::Gemini(p) => p,
            #[cfg(feature = "ollama")]
            AnyProtocol::Ollama(p) => p,
            AnyProtocol::Sse(p) => p,
        }
    }

    #[inline]
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        // Static dispatch on the hot path.
        match self {
            #[cfg(feature = "openai-chat")]
            AnyProtocol::Chat(p) => p.on_frame(frame, decode, ev),
            #[cfg(feature = "openai-responses")]
            AnyProtocol::Responses(p) => p.on_frame(frame, decode, ev),
            #[cfg(feature = "anthropic")]
            AnyProtocol::Anthropic(p) => p.on_frame(frame, decode, ev),
            #[cfg(feature = "gemini")]
            AnyProtocol::Gemini(p) => p.on_frame(frame, decode, ev),
            #[cfg(feature = "ollama")]
            AnyProtocol::Ollama(p) => p.on_frame(frame, decode, ev),
            AnyProtocol::Sse(p) => p.on_frame(frame, decode, ev),
        }
    }
}

/// The value of an SSE line cut short when it is a `data:` field.
fn data_value(line: &[u8]) -> Option<&[u8]> {
    data_value_start(line).map(|start| &line[start.min(line.len())..])
}

/// Where an event a read completed ends, as
/// [`StreamObserver::observe_ends`] notes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventEnd {
    /// Stream offset just past the event.
    pub end_offset: u64,
    /// A resumed server repeated it (at or below the resume cursor).
    pub duplicate: bool,
    /// It carried semantic output.
    pub semantic: bool,
}

/// Observes one attempt's response body.
#[derive(Debug, Clone)]
pub struct StreamObserver {
    kind: ProtocolKind,
    config: ObserverConfig,
    decode: Decode,
    framing: Framing,
    protocol: AnyProtocol,
    ev: Evidence,
    violation: Option<ProtocolViolation>,
    end: Option<EndOfStream>,
    committed_at: Option<u64>,
    /// The decoder's last-event-id version already copied into the cursor.
    id_version: u64,
}

/// One read's items (SSE events, NDJSON lines) folded into the evidence.
struct ReadFeed<'a, F> {
    protocol: &'a mut AnyProtocol,
    ev: &'a mut Evidence,
    feed: &'a mut Feed,
    decode: Decode,
    limits: Limits,
    on_event: &'a mut F,
}

impl<F: FnMut(&EventRecord)> ReadFeed<'_, F> {
    /// Classifies `frame` (a keepalive when `None`: an SSE comment, a blank
    /// NDJSON line) and folds it in, as one decoded item ending at
    /// `end_offset`.
    fn fold(&mut self, frame: Option<Frame<'_>>, end_offset: u64) -> Result<(), ProtocolViolation> {
        let ev = &mut *self.ev;
        let (info, before) = match frame {
            None => (EventInfo::of(EventClass::Keepalive), (true, true, true)),
            Some(frame) => {
                let before = (
                    ev.progress.semantic_observed(),
                    ev.terminal.is_some(),
                    ev.provider_error.is_some(),
                );
                (self.protocol.on_frame(frame, self.decode, ev)?, before)
            }
        };
        account(
            ev, self.feed, info, end_offset, before.0, before.1, before.2,
        );
        (self.on_event)(&EventRecord { info, end_offset });
        Ok(())
    }
}

impl<F: FnMut(&EventRecord)> SseSink for ReadFeed<'_, F> {
    fn item(&mut self, item: SseItem<'_>) -> Result<(), ProtocolViolation> {
        let (frame, end_offset) = match item {
            SseItem::Comment { end_offset } => (None, end_offset),
            SseItem::Event(e) => (
                Some(Frame {
                    event_type: e.event_type,
                    data: e.data,
                }),
                e.end_offset,
            ),
        };
        self.fold(frame, end_offset)
    }

    /// The fused path for the usual event: a plain delta of the protocol's
    /// learned shape on one `data:` line (after an `event:` line, for the
    /// protocols that name events), then a blank line. Framing and
    /// classification in one comparison against the template, without the
    /// data line's search; the result equals the decoder's dispatch followed
    /// by the protocol's classification (the learned document holds no line
    /// end, and template holes, being JSON string bodies, hold no control
    /// byte, so a match cannot span lines).
    fn whole_events(&mut self, rest: &[u8], offset: u64) -> Option<usize> {
        if self.decode != Decode::Fast {
            return None;
        }
        let limits = self.limits;
        let mut taken = 0;
        match &mut *self.protocol {
            #[cfg(feature = "openai-chat")]
            AnyProtocol::Chat(chat) => loop {
                let buf = tail(rest, taken);
                let Some(v) = data_value_start(buf) else {
                    break;
                };
                let Some(found) = chat.delta_prefix(tail(buf, v)) else {
                    break;
                };
                let event = Delta {
                    buf,
                    named: (0, 0),
                    value: v,
                    found,
                };
                let at = offset + taken as u64;
                let Some(n) = take(self.ev, self.feed, self.on_event, event, limits, at) else {
                    break;
                };
                taken += n;
            },
            // Named events: the classification of a learned delta does not
            // read the name (the type is in the template's fixed bytes).
            #[cfg(feature = "anthropic")]
            AnyProtocol::Anthropic(anthropic) => loop {
                let buf = tail(rest, taken);
                let Some(named) = event_line(buf, limits.max_line) else {
                    break;
                };
                let Some(v) = data_value_start(tail(buf, named.0)) else {
                    break;
                };
                let settled = self.ev.is_settled();
                let Some(found) = anthropic.delta_prefix(tail(buf, named.0 + v), settled) else {
                    break;
                };
                let event = Delta {
                    buf,
                    named,
                    value: v,
                    found,
                };
                let at = offset + taken as u64;
                let Some(n) = take(self.ev, self.feed, self.on_event, event, limits, at) else {
                    break;
                };
                taken += n;
            },
            _ => {}
        }
        (taken > 0).then_some(taken)
    }
}

impl<F: FnMut(&EventRecord)> NdjsonSink for ReadFeed<'_, F> {
    fn item(&mut self, item: NdjsonItem<'_>) -> Result<(), ProtocolViolation> {
        let (frame, end_offset) = match item {
            NdjsonItem::Blank { end_offset } => (None, end_offset),
            NdjsonItem::Line { data, end_offset } => (
                Some(Frame {
                    event_type: b"",
                    data,
                }),
                end_offset,
            ),
        };
        self.fold(frame, end_offset)
    }

    /// The fused path for Ollama: each plain delta line of the learned
    /// shape, followed at once by LF and within the cap, is classified in
    /// one comparison against the template, without the line search; the
    /// result equals the decoder's line followed by the protocol's
    /// classification (the learned document holds no line end).
    #[cfg(feature = "ollama")]
    fn whole_lines(&mut self, rest: &[u8], offset: u64) -> Option<usize> {
        let (Decode::Fast, AnyProtocol::Ollama(ollama)) = (self.decode, &mut *self.protocol) else {
            return None;
        };
        // The decoder's cap for a line.
        let cap = self.limits.max_line.min(self.limits.max_event);
        let mut taken = 0;
        loop {
            let buf = tail(rest, taken);
            let Some((len, kind)) = ollama.delta_prefix(buf, self.ev.is_settled()) else {
                break;
            };
            if !matches!(buf.get(len), Some(b'\n')) || len > cap {
                break;
            }
            taken += len + 1;
            fold_delta(
                self.ev,
                self.feed,
                self.on_event,
                offset + taken as u64,
                kind,
            );
        }
        (taken > 0).then_some(taken)
    }
}

/// A plain delta event as a protocol found it at the start of `buf`.
#[derive(Clone, Copy)]
struct Delta<'b> {
    buf: &'b [u8],
    /// The event line's length and its name's (zero for an unnamed event).
    named: (usize, usize),
    /// Where the data value starts in the `data:` line.
    value: usize,
    /// The data value's length, and the semantic kind it shows, if any.
    found: (usize, Option<SemanticKind>),
}

/// Takes `delta`, an event at `offset`, when a blank line follows its data
/// line at once and the line and event caps hold: folds it in and returns
/// its length.
#[inline]
fn take<F: FnMut(&EventRecord)>(
    ev: &mut Evidence,
    feed: &mut Feed,
    on_event: &mut F,
    delta: Delta<'_>,
    limits: Limits,
    offset: u64,
) -> Option<usize> {
    let Delta {
        buf,
        named,
        value,
        found: (len, kind),
    } = delta;
    let data = tail(buf, named.0);
    let line = value + len;
    if !matches!(data.get(line), Some(b'\n'))
        || !matches!(data.get(line + 1), Some(b'\n'))
        || line > limits.max_line
        || len + 1 + named.1 > limits.max_event
    {
        return None;
    }
    let n = named.0 + line + 2;
    fold_delta(ev, feed, on_event, offset + n as u64, kind);
    Some(n)
}

/// The bytes of `buf` from `at` on (none past its end). Unlike indexing,
/// this stays inline at opt-level "z", where the indexing function is an
/// out-of-line call with its panic path on every event.
#[allow(clippy::inline_always)]
#[inline(always)]
fn tail(buf: &[u8], at: usize) -> &[u8] {
    buf.get(at..).unwrap_or_default()
}

/// Folds in a plain delta event ending at `end_offset` as `account` would:
/// neither terminal proof nor a provider error comes from one.
#[inline]
fn fold_delta<F: FnMut(&EventRecord)>(
    ev: &mut Evidence,
    feed: &mut Feed,
    on_event: &mut F,
    end_offset: u64,
    kind: Option<SemanticKind>,
) {
    let progress = &mut ev.progress;
    let class = match kind {
        Some(kind) => {
            if !progress.semantic_observed() {
                feed.committed_at = Some(end_offset);
            }
            progress.observe(kind);
            EventClass::Semantic(kind)
        }
        None => EventClass::NonSemantic,
    };
    progress.frames += 1;
    feed.frames += 1;
    on_event(&EventRecord {
        info: EventInfo::of(class),
        end_offset,
    });
}

/// An `event:` line at the start of `buf`, ended by LF alone and within the
/// line cap: its length with the LF, and the length of the name (what the
/// decoder would keep as the event type).
#[inline]
fn event_line(buf: &[u8], max_line: usize) -> Option<(usize, usize)> {
    if !buf.starts_with(b"event:") {
        return None;
    }
    let end = memchr2(b'\n', b'\r', &buf[..buf.len().min(max_line + 1)])?;
    if buf[end] != b'\n' {
        return None;
    }
    let name = if matches!(buf.get(6), Some(b' ')) && end > 6 {
        7
    } else {
        6
    };
    Some((end + 1, end - name))
}

/// Folds one classified frame into the read's [`Feed`].
#[inline]
fn account(
    ev: &mut Evidence,
    feed: &mut Feed,
    info: EventInfo,
    end_offset: u64,
    was_semantic: bool,
    was_terminal: bool,
    was_error: bool,
) {
    feed.frames += 1;
    if info.class == EventClass::Keepalive {
        ev.progress.keepalives += 1;
    } else {
        ev.progress.frames += 1;
    }
    if !was_semantic && ev.progress.semantic_observed() {
        feed.committed_at = Some(end_offset);
    }
    if !was_terminal && let Some(t) = &ev.terminal {
        feed.terminal = Some(t.clone());
    }
    if !was_error && let Some(e) = &ev.provider_error {
        feed.provider_error = Some(e.clone());
    }
}

impl StreamObserver {
    /// An observer for a streamed body of `kind` with default settings.
    pub fn new(kind: ProtocolKind) -> Self {
        Self::with_config(kind, ObserverConfig::default())
    }

    /// An observer for a streamed body of `kind`.
    pub fn with_config(kind: ProtocolKind, config: ObserverConfig) -> Self {
        let framing = if kind.is_ndjson() {
            Framing::Ndjson(NdjsonDecoder::new(config.limits))
        } else {
            Framing::Sse(SseDecoder::new(config.limits))
        };
        Self::build(kind, config, framing)
    }

    /// An observer for a non-streamed (`stream: false`) JSON body of `kind`:
    /// the body is kept (up to `limits.max_event`) and judged at EOF.
    pub fn non_streaming(kind: ProtocolKind, config: ObserverConfig) -> Self {
        Self::build(kind, config, Framing::Body(Vec::new()))
    }

    /// The observer for a successful answer of `form` with the default
    /// configuration and `limits`: a stream decoder, or the whole-body judge
    /// for a JSON (non-streamed) answer. What the machine and an
    /// `ObserveLayer` both build for an answer's content type.
    pub fn for_form(kind: &ProtocolKind, limits: Limits, form: BodyForm) -> Self {
        let config = ObserverConfig {
            limits,
            ..ObserverConfig::default()
        };
        match form {
            BodyForm::Stream => Self::with_config(kind.clone(), config),
            BodyForm::WholeJson => Self::non_streaming(kind.clone(), config),
            BodyForm::Opaque => Self::build(kind.clone(), config, Framing::Opaque),
        }
    }

    fn build(kind: ProtocolKind, config: ObserverConfig, framing: Framing) -> Self {
        let mut ev = Evidence::default();
        ev.cursor.sequence_number = config.resume_after_sequence;
        StreamObserver {
            protocol: AnyProtocol::new(&kind, config.semantic),
            decode: Decode::new(config.reference_decode),
            kind,
            config,
            framing,
            ev,
            violation: None,
            end: None,
            committed_at: None,
            id_version: 0,
        }
    }

    /// Feeds one body read. The bytes are only read, never changed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Feed, ProtocolViolation> {
        self.feed_with(chunk, |_| {})
    }

    /// Feeds one body read, for a driver that reads the evidence from the
    /// observer afterwards rather than from a per-read [`Feed`] (cheaper
    /// per read: no summary is handed back).
    pub fn observe(&mut self, chunk: &[u8]) -> Result<(), ProtocolViolation> {
        self.observe_ends(chunk, None)
    }

    /// [`StreamObserver::observe`], noting where each event it completes
    /// ends (`end_offset`, duplicate, semantic) in `ends`. One
    /// instantiation of the decoder serves both (the wasm module carries
    /// it once).
    pub fn observe_ends(
        &mut self,
        chunk: &[u8],
        mut ends: Option<&mut Vec<EventEnd>>,
    ) -> Result<(), ProtocolViolation> {
        let mut feed = Feed::default();
        self.summarize(
            chunk,
            |e| {
                if let Some(ends) = ends.as_mut() {
                    ends.push(EventEnd {
                        end_offset: e.end_offset,
                        duplicate: e.info.duplicate,
                        semantic: matches!(e.info.class, EventClass::Semantic(_)),
                    });
                }
            },
            &mut feed,
        )
    }

    /// Feeds one body read and calls `on_event` for every frame it completes.
    pub(crate) fn feed_with<F>(
        &mut self,
        chunk: &[u8],
        on_event: F,
    ) -> Result<Feed, ProtocolViolation>
    where
        F: FnMut(&EventRecord),
    {
        let mut feed = Feed::default();
        self.summarize(chunk, on_event, &mut feed).map(|()| feed)
    }

    /// Feeds one read, summing up what it changed in `feed`.
    fn summarize<F>(
        &mut self,
        chunk: &[u8],
        mut on_event: F,
        feed: &mut Feed,
    ) -> Result<(), ProtocolViolation>
    where
        F: FnMut(&EventRecord),
    {
        if let Some(v) = self.violation {
            return Err(v);
        }
        self.ev.progress.raw_bytes += chunk.len() as u64;
        let decode = self.decode;
        let protocol = &mut self.protocol;
        let ev = &mut self.ev;
        let result = match &mut self.framing {
            Framing::Sse(dec) => {
                let mut sink = ReadFeed {
                    protocol,
                    ev,
                    feed,
                    decode,
                    limits: self.config.limits,
                    on_event: &mut on_event,
                };
                // A read of whole plain deltas never reaches the decoder.
                let mut rest = chunk;
                if dec.at_event_boundary()
                    && let Some(n) = sink.whole_events(chunk, dec.consumed())
                {
                    dec.skip_taken(n);
                    rest = &chunk[n..];
                }
                if rest.is_empty() {
                    Ok(())
                } else {
                    dec.feed_into(rest, sink)
                }
            }
            Framing::Ndjson(dec) => {
                let sink = ReadFeed {
                    protocol,
                    ev,
                    feed,
                    decode,
                    limits: self.config.limits,
                    on_event: &mut on_event,
                };
                dec.feed_into(chunk, sink)
            }
            Framing::Body(buf) => {
                let cap = self.config.limits.max_event;
                if buf.len() + chunk.len() > cap {
                    Err(ProtocolViolation::EventTooLarge { cap })
                } else {
                    buf.extend_from_slice(chunk);
                    Ok(())
                }
            }
            Framing::Opaque => {
                // Every read is output: it commits the answer, and each one
                // is progress for the watchdogs.
                if !chunk.is_empty() {
                    ev.progress.observe(SemanticKind::Content);
                    let end_offset = ev.progress.raw_bytes;
                    feed.committed_at.get_or_insert(end_offset);
                }
                Ok(())
            }
        };
        if let Framing::Sse(dec) = &self.framing {
            // Copied when it changed at any dispatch of this read (even back
            // to empty), so the cursor does not depend on where reads end.
            let version = dec.last_event_id_version();
            if version != self.id_version {
                self.id_version = version;
                let id = dec.last_event_id();
                self.ev.cursor.last_event_id = Some(String::from_utf8_lossy(id).into_owned());
            }
        }
        if self.committed_at.is_none() {
            self.committed_at = feed.committed_at;
        }
        match result {
            Ok(()) => Ok(()),
            Err(v) => {
                self.violation = Some(v);
                Err(v)
            }
        }
    }

    /// Judges the body at a clean transport EOF. Idempotent.
    pub fn finish(&mut self) -> EndOfStream {
        if let Some(end) = &self.end {
            return end.clone();
        }
        let end = self.judge();
        self.end = Some(end.clone());
        end
    }

    fn judge(&mut self) -> EndOfStream {
        if let Some(violation) = self.violation {
            return EndOfStream::Violation { violation };
        }
        let pending = match &mut self.framing {
            Framing::Ndjson(dec) => {
                let tail = dec.pending().to_vec();
                if tail.iter().all(u8::is_ascii_whitespace) {
                    None
                } else {
                    // R33: a complete object without its final newline counts.
                    let before = self.ev.progress.frames;
                    let frame = Frame {
                        event_type: b"",
                        data: &tail,
                    };
                    match self.protocol.on_frame(frame, self.decode, &mut self.ev) {
                        Ok(_) => {
                            self.ev.progress.frames = before + 1;
                            self.ev.unterminated_final_line = true;
                            None
                        }
                        Err(_) => self.unfinished(),
                    }
                }
            }
            Framing::Body(buf) => {
                let body = std::mem::take(buf);
                if body.iter().all(u8::is_ascii_whitespace) {
                    None
                } else {
                    let parsed =
                        classify_json_body(&self.kind, &body, self.config.semantic, &mut self.ev);
                    if parsed.is_ok() {
                        None
                    } else {
                        let semantic = partial_body_may_be_semantic(&body);
                        if semantic {
                            // Content inside a cut answer was observed.
                            self.ev.progress.observe(SemanticKind::Content);
                        }
                        Some(Unfinished {
                            bytes: body.len() as u64,
                            may_be_semantic: semantic,
                        })
                    }
                }
            }
            Framing::Sse(_) => self.unfinished(),
            Framing::Opaque => {
                self.ev.terminal = Some(Terminal::Success {
                    proof: Proof::Strong,
                });
                None
            }
        };
        self.ev.pending_at_eof = pending;
        if self.ev.terminal.is_none()
            && self.ev.provider_error.is_none()
            && let Some(t) = self.protocol.get().on_eof(&self.ev, pending.is_some())
        {
            self.ev.terminal = Some(t);
        }
        if let Some(error) = &self.ev.provider_error {
            return EndOfStream::ProviderError {
                error: error.clone(),
            };
        }
        match &self.ev.terminal {
            Some(Terminal::Success { proof }) => EndOfStream::Success { proof: *proof },
            Some(Terminal::Unsuccessful { reason }) => EndOfStream::Unsuccessful {
                reason: reason.clone(),
            },
            None => EndOfStream::UnexpectedEof { pending },
        }
    }

    /// Stream offset past the frame that carried the first semantic output,
    /// once seen. Also set when that frame completed in a read that then
    /// failed with a protocol violation.
    pub fn committed_at(&self) -> Option<u64> {
        self.committed_at
    }

    /// The protocol this observer decodes.
    pub fn kind(&self) -> &ProtocolKind {
        &self.kind
    }

    /// Progress counters.
    pub fn progress(&self) -> &Progress {
        &self.ev.progress
    }

    /// Progress counters, for drivers recording delivery.
    pub fn progress_mut(&mut self) -> &mut Progress {
        &mut self.ev.progress
    }

    /// Terminal proof, once reached.
    pub fn terminal(&self) -> Option<&Terminal> {
        self.ev.terminal.as_ref()
    }

    /// The first in-stream provider error.
    pub fn provider_error(&self) -> Option<&ProviderError> {
        self.ev.provider_error.as_ref()
    }

    /// Where the stream could be resumed from.
    pub fn cursor(&self) -> &ResumeCursor {
        &self.ev.cursor
    }

    /// Provider-reported usage (absent fields stay absent).
    pub fn usage(&self) -> &Usage {
        &self.ev.generation.usage
    }

    /// What the provider said of the generation so far: the model that
    /// answered, finish reasons, usage.
    pub fn generation(&self) -> &Generation {
        &self.ev.generation
    }

    /// Everything observed so far.
    #[cfg(test)]
    pub(crate) fn evidence(&self) -> &Evidence {
        &self.ev
    }

    /// Bytes pending at EOF, known once [`finish`](Self::finish) ran.
    pub fn pending_at_eof(&self) -> Option<Unfinished> {
        self.ev.pending_at_eof
    }

    /// The frame the stream is inside now, judged by one rule however the
    /// attempt ends (a clean end, a reset, a stall; reliability matrix AT3):
    /// `None` between frames. Its bytes may hold semantic output when they
    /// show a semantic value begun, or cannot rule one out; a frame named
    /// as non-semantic, a keepalive, or JSON cut before any semantic value
    /// began (`data: {`) holds none. Reads only; the stream goes on.
    pub fn unfinished(&self) -> Option<Unfinished> {
        match &self.framing {
            Framing::Sse(dec) => {
                let p = dec.pending();
                if p.is_empty() {
                    return None;
                }
                let named_inert = !p.event_type.is_empty()
                    && self
                        .protocol
                        .get_ref()
                        .non_semantic_event_type(p.event_type);
                let mut data = p.data.to_vec();
                if let Some(value) = data_value(p.partial_line) {
                    data.extend_from_slice(value);
                }
                let may_be_semantic = !named_inert
                    && match self.kind {
                        // Plain text: any data may be output.
                        ProtocolKind::Sse { .. } => !data.is_empty(),
                        _ => partial_body_may_be_semantic(&data),
                    };
                Some(Unfinished {
                    bytes: dec.buffered() as u64,
                    may_be_semantic,
                })
            }
            Framing::Ndjson(dec) => {
                let tail = dec.pending();
                (!tail.iter().all(u8::is_ascii_whitespace)).then(|| Unfinished {
                    bytes: tail.len() as u64,
                    may_be_semantic: partial_body_may_be_semantic(tail),
                })
            }
            Framing::Body(buf) => (!buf.iter().all(u8::is_ascii_whitespace)).then(|| Unfinished {
                bytes: buf.len() as u64,
                may_be_semantic: partial_body_may_be_semantic(buf),
            }),
            Framing::Opaque => None,
        }
    }

    /// The protocol violation that stopped decoding, if any.
    pub fn violation(&self) -> Option<ProtocolViolation> {
        self.violation
    }

    /// Tool calls that may be executed: completed ones, after success proof.
    pub fn executable_tool_calls(&self) -> u64 {
        self.ev.executable_tool_calls()
    }

    /// Bytes the framer currently buffers (bounded by the caps).
    pub fn buffered(&self) -> usize {
        match &self.framing {
            Framing::Sse(d) => d.buffered(),
            Framing::Ndjson(d) => d.buffered(),
            Framing::Body(b) => b.len(),
            Framing::Opaque => 0,
        }
    }
}
