//! Where the request is sent: its method and URL, the targets it may be
//! served from ([`crate::failover`]) and the one in use, and its slot in the
//! cooldown store it shares with other requests.

use std::sync::Arc;
use std::time::Duration;

use super::io::RequestFacts;
use crate::body_fields::BodyFields;
use crate::cooldown::CooldownStore;
use crate::failover::{PRIMARY, Target};
use crate::protocol::{ProtocolChoice, ProtocolKind, is_generation};
use crate::timing::Instant;

/// The request's route. See the module docs.
#[derive(Debug)]
pub(super) struct Route {
    /// The method of every send.
    pub(super) method: String,
    /// The URL of the target in use.
    pub(super) url: String,
    /// The request asked for a background stream (`background` and
    /// `stream` both true), which OpenAI Responses can resume.
    pub(super) background: bool,
    /// The endpoint was declared an SSE server that honours `Last-Event-ID`.
    pub(super) sse_resumable: bool,
    /// The request asks the target for a whole answer, not a stream
    /// ([`ProtocolKind::asks_whole_answer`]): its head is its end.
    pub(super) whole: bool,
    /// The request asks for a generation ([`is_generation`]); its answer is
    /// passed through as it comes when not.
    pub(super) generation: bool,
    /// The cooldown store shared with other requests, and this one's key.
    cooldown: Option<Shared>,
    /// Where each target sends (the request's own first); empty when the
    /// request has no alternates.
    targets: Vec<TargetFacts>,
    /// The target `url`, `background` and the cooldown key are those of.
    at: usize,
}

/// What the machine needs of one target.
#[derive(Debug)]
struct TargetFacts {
    url: String,
    protocol: ProtocolKind,
    background: bool,
    whole: bool,
    cooldown_key: String,
}

/// A cooldown store and the key of this request in it.
struct Shared {
    store: Arc<dyn CooldownStore>,
    key: String,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cooldown")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// What the ledger learns of the targets when alternates are set.
pub(super) struct Declared {
    /// Each target's label, the request's own first.
    pub(super) labels: Vec<String>,
    /// Each target's declared context window.
    pub(super) windows: Vec<Option<u64>>,
}

impl Route {
    pub(super) fn new(request: RequestFacts<'_>, protocol: &ProtocolKind) -> Self {
        Route {
            method: request.method.to_owned(),
            url: request.url.to_owned(),
            background: request.fields().background_stream(),
            sse_resumable: false,
            whole: protocol.asks_whole_answer(
                request.method,
                request.url,
                request.fields().stream(),
            ),
            generation: is_generation(request.method, request.url),
            cooldown: None,
            targets: Vec::new(),
            at: 0,
        }
    }

    /// Lets the request be served by `alternates`, in order; `request`,
    /// `protocol` (as given) and `own` (as resolved) are the request's.
    pub(super) fn with_alternates(
        &mut self,
        request: RequestFacts<'_>,
        protocol: &ProtocolChoice,
        own: &ProtocolKind,
        alternates: &[Target],
    ) -> Declared {
        let primary = TargetFacts {
            url: self.url.clone(),
            protocol: own.clone(),
            background: self.background,
            whole: self.whole,
            cooldown_key: self.cooldown.as_ref().map_or_else(
                || crate::cooldown::key_of(request.url, &request.fields()),
                |c| c.key.clone(),
            ),
        };
        let mut labels = vec![PRIMARY.to_owned()];
        let mut windows = vec![None];
        self.targets.push(primary);
        for t in alternates {
            windows.push(t.context_window());
            let url = t.rewrite_url(request.url).into_owned();
            let body = t.rewrite_body(request.body);
            let fields = BodyFields::read(&body);
            let protocol = t.protocol().unwrap_or(protocol).resolve(&url);
            self.targets.push(TargetFacts {
                whole: protocol.asks_whole_answer(&self.method, &url, fields.stream()),
                protocol,
                background: fields.background_stream(),
                cooldown_key: crate::cooldown::key_of(&url, &fields),
                url,
            });
            labels.push(t.label().to_owned());
        }
        Declared { labels, windows }
    }

    /// Shares waits with the other requests that use `store`, under `key`.
    pub(super) fn share_cooldown(&mut self, store: Arc<dyn CooldownStore>, key: String) {
        if let Some(own) = self.targets.first_mut() {
            own.cooldown_key.clone_from(&key);
        }
        self.cooldown = Some(Shared { store, key });
    }

    /// Takes up target `i`'s facts when it is not the one in use; its
    /// protocol, then.
    pub(super) fn adopt(&mut self, i: usize) -> Option<ProtocolKind> {
        if i == self.at {
            return None;
        }
        let facts = self.targets.get(i)?;
        self.at = i;
        self.url.clone_from(&facts.url);
        self.background = facts.background;
        self.whole = facts.whole;
        if let Some(c) = self.cooldown.as_mut() {
            c.key.clone_from(&facts.cooldown_key);
        }
        Some(facts.protocol.clone())
    }

    /// The protocol target `i` speaks, when the request has alternates.
    pub(super) fn protocol_of(&self, i: usize) -> Option<&ProtocolKind> {
        self.targets.get(i).map(|t| &t.protocol)
    }

    /// Whether target `i` speaks `protocol` (without alternates, only the
    /// request's own target exists).
    pub(super) fn speaks(&self, i: usize, protocol: &ProtocolKind) -> bool {
        self.targets
            .get(i)
            .map_or(i == 0, |t| t.protocol == *protocol)
    }

    /// A wait in force for the target in use, learned by any request.
    pub(super) fn cooldown(&self, now: Instant) -> Option<Duration> {
        let c = self.cooldown.as_ref()?;
        c.store.remaining(&c.key, now)
    }

    /// Notes a wait this request learned from the target in use.
    pub(super) fn note_cooldown(&self, now: Instant, wait: Duration) {
        if let Some(c) = &self.cooldown {
            c.store.note(&c.key, now, wait);
        }
    }
}
