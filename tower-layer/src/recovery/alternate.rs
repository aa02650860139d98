//! Alternates: where a request may be served from before its first token
//! when its own endpoint is overloaded ([`recovery_core::failover`]).
//!
//! The machine decides when to switch and to which target; this module
//! only rewrites the request for the target it names: the URL, the body's
//! model and the headers (an alternate's own credentials, kept here and
//! never shown by `Debug`, reports or events).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName, HeaderValue};
use recovery_core::failover::{Target, TargetError};
use recovery_core::protocol::ProtocolKind;

/// One place a request may be sent instead of its own, before commit:
/// another provider, region or model. Build it, then hand it to
/// [`RecoveryLayer::with_alternate`](crate::RecoveryLayer::with_alternate).
///
/// ```
/// use http::{HeaderValue, header::AUTHORIZATION};
/// use tower_recovery::Alternate;
/// use tower_recovery::core::protocol::ProtocolKind;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let claude = Alternate::new("anthropic")?
///     .url("https://api.anthropic.com/v1/messages")?
///     .model("claude-sonnet-4-5")?
///     .protocol(ProtocolKind::Anthropic)
///     .header("x-api-key".parse()?, HeaderValue::from_static("sk-ant-..."))
///     .without_header(AUTHORIZATION);
/// # let _ = claude; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Alternate {
    pub(crate) target: Target,
    headers: HeaderMap,
    removed: Vec<HeaderName>,
    pub(crate) map_body: Option<MapBody>,
    /// The protocol of the requests it may serve; `None`: any.
    pub(crate) serves: Option<ProtocolKind>,
}

/// A caller's rewrite of a request body for one alternate.
pub(crate) type MapBody = Arc<dyn Fn(&[u8]) -> Vec<u8> + Send + Sync>;

impl Alternate {
    /// An alternate named `label` (1 to 64 of `A-Z a-z 0-9 . _ -`: reports
    /// and events carry it). Until told otherwise it sends the request
    /// unchanged.
    pub fn new(label: impl Into<String>) -> Result<Self, TargetError> {
        Ok(Alternate {
            target: Target::new(label)?,
            headers: HeaderMap::new(),
            removed: Vec::new(),
            map_body: None,
            serves: None,
        })
    }

    /// Sends to `url` instead: absolute, or a path on the request's own
    /// origin.
    pub fn url(mut self, url: impl Into<String>) -> Result<Self, TargetError> {
        self.target = self.target.with_url(url)?;
        Ok(self)
    }

    /// Asks for `model` instead (the top-level `"model"` of a JSON body).
    pub fn model(mut self, model: impl Into<String>) -> Result<Self, TargetError> {
        self.target = self.target.with_model(model)?;
        Ok(self)
    }

    /// Declares this alternate's context window, in tokens: a prompt too
    /// long for a target (`context_length_exceeded`, "prompt is too long",
    /// ...) moves to the next alternate whose window is larger, or to the
    /// next one when none after it declares a window.
    #[must_use]
    pub fn context_window(mut self, tokens: u64) -> Self {
        self.target = self.target.with_context_window(tokens);
        self
    }

    /// Declares that this alternate continues an assistant message it is
    /// given, in the form `prefill`: a committed answer cut after text only,
    /// whose own endpoint declares no prefill, is continued here with the
    /// delivered text as that message (same protocol only), the
    /// continuation spliced after it.
    #[must_use]
    pub fn prefill(mut self, prefill: recovery_core::continuation::Prefill) -> Self {
        self.target = self.target.with_prefill(prefill);
        self
    }

    /// Sends the request's body as `map` rewrites it (an alternate that
    /// speaks another protocol takes the request in its own shape); the
    /// model of [`Alternate::model`] is set after. Called once per request
    /// that has this alternate, before its first send.
    #[must_use]
    pub fn map_body(mut self, map: impl Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static) -> Self {
        self.map_body = Some(Arc::new(map));
        self
    }

    /// The protocol this alternate's answers speak, when it is not the
    /// request's own.
    #[must_use]
    pub fn protocol(mut self, protocol: ProtocolKind) -> Self {
        self.target = self.target.with_protocol(protocol.into());
        self
    }

    /// Sets `name` to `value` on every send to this alternate (its API key,
    /// say). The value is marked sensitive. A send to another origin goes
    /// without the request's own credentials
    /// ([`CREDENTIAL_HEADERS`](recovery_core::failover::CREDENTIAL_HEADERS))
    /// whatever is set here.
    #[must_use]
    pub fn header(mut self, name: HeaderName, mut value: HeaderValue) -> Self {
        value.set_sensitive(true);
        self.headers.insert(name, value);
        self
    }

    /// Removes `name` from every send to this alternate (the primary's
    /// credentials, say).
    #[must_use]
    pub fn without_header(mut self, name: HeaderName) -> Self {
        self.removed.push(name);
        self
    }

    /// Considers this alternate only for requests of `protocol` (the
    /// layer's, or the call's own,
    /// [`RecoveryCall::with_protocol`](recovery_core::call::RecoveryCall::with_protocol)):
    /// one layer in front of several protocols keeps each protocol's
    /// alternates to its own requests.
    #[must_use]
    pub fn serving(mut self, protocol: ProtocolKind) -> Self {
        self.serves = Some(protocol);
        self
    }

    /// Whether a request decoded as `protocol` may go here.
    pub(crate) fn serves(&self, protocol: &ProtocolKind) -> bool {
        self.serves.as_ref().is_none_or(|p| p == protocol)
    }

    /// The label reports and events carry.
    pub fn label(&self) -> &str {
        self.target.label()
    }

    /// The names of the headers set on every send (never their values):
    /// what a gateway checks to know whether an alternate holds
    /// credentials of its own.
    pub fn header_names(&self) -> impl Iterator<Item = HeaderName> + '_ {
        self.headers.keys().cloned()
    }

    /// Rewrites a send's head for this alternate: its URL (`url` is what
    /// the machine names, the resume URL included; `original` the
    /// request's own) and headers.
    pub(crate) fn head(
        &self,
        head: &mut http::request::Parts,
        url: &str,
        original: &str,
    ) -> Result<(), ()> {
        head.uri = url.parse().map_err(|_| ())?;
        let left: Vec<HeaderName> = head
            .headers
            .keys()
            .filter(|name| !self.target.keeps_header(original, name.as_str()))
            .cloned()
            .collect();
        for name in left {
            head.headers.remove(name);
        }
        for name in &self.removed {
            head.headers.remove(name);
        }
        for (name, value) in &self.headers {
            head.headers.insert(name, value.clone());
        }
        Ok(())
    }

    /// The body of a send to `target` (this alternate's, with the request's
    /// own body mapped); `head`'s length follows it.
    pub(crate) fn body(target: &Target, head: &mut http::request::Parts, body: &Bytes) -> Bytes {
        match target.rewrite_body(body) {
            std::borrow::Cow::Borrowed(_) => body.clone(),
            std::borrow::Cow::Owned(rewritten) => {
                if head.headers.contains_key(CONTENT_LENGTH) {
                    head.headers
                        .insert(CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
                }
                Bytes::from(rewritten)
            }
        }
    }
}

/// Names only: header values are credentials.
impl fmt::Debug for Alternate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alternate")
            .field("label", &self.target.label())
            .field("url", &self.target.url())
            .field("model", &self.target.model())
            .field("protocol", &self.target.protocol())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("removed", &self.removed)
            .field("map_body", &self.map_body.is_some())
            .field("serves", &self.serves)
            .finish()
    }
}
