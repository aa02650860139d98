use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use recovery_core::body_fields::ReadFields;
use recovery_core::call::{RecoveryCall, SendCredit};
use recovery_core::cooldown;
use recovery_core::error::RecoveryError;
use recovery_core::exchange::{RequestFacts, Setup};
use recovery_core::failover::Target;
use recovery_core::outcome::ReplayDisabled;
use recovery_core::protocol::{ProtocolChoice, ProtocolKind};
use tower_service::Service;

use super::body::RecoveryBody;
use super::bounds::{InnerService, StreamBody};
use super::driver::{Driver, Sender, Sent};
use super::future::ResponseFuture;
use super::hooks::{Config, Hooks};
use super::origin::Origin;
use crate::BoxError;
use crate::request_body::{Buffered, ReplayBody, buffer};

/// Recovers streamed responses of the inner service. See [`RecoveryLayer`].
///
/// [`RecoveryLayer`]: super::RecoveryLayer
pub struct Recover<S, T, C> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config<T, C>>,
}

impl<S, T, C> Recover<S, T, C> {
    /// The inner service.
    ///
    /// ```
    /// use tower_layer::Layer;
    /// use tower_recovery::core::{policy::RecoveryPolicy, protocol::ProtocolKind};
    /// use tower_recovery::{ObserveLayer, RecoveryLayer};
    ///
    /// #[derive(Debug, PartialEq)]
    /// struct Client(u8);
    /// let stack = ObserveLayer::new(ProtocolKind::OpenAiChat).layer(Client(1));
    /// let mut svc = RecoveryLayer::new(RecoveryPolicy::default()).layer(stack);
    /// assert_eq!(svc.get_ref().get_ref(), &Client(1));
    /// svc.get_mut().get_mut().0 = 2;
    /// assert_eq!(svc.into_inner().into_inner(), Client(2));
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, this layer removed.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, T, C> Clone for Recover<S, T, C> {
    fn clone(&self) -> Self {
        Recover {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, T, C> fmt::Debug for Recover<S, T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recover")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResBody, T, C> Service<Request<B>> for Recover<S, T, C>
where
    S: Service<Request<ReplayBody>, Response = Response<ResBody>> + InnerService<ResBody>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: StreamBody,
{
    type Response = Response<RecoveryBody<ResBody>>;
    type Error = RecoveryError;
    type Future = ResponseFuture<ResBody>;

    /// Always ready: readiness of the inner service is polled on a fresh
    /// clone before every send, so no permit is held while backing off.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let sender: Box<dyn Sender<ResBody>> = Box::new(Through(self.inner.clone()));
        let hooks = Arc::clone(&self.config.hooks);
        ResponseFuture::new(Box::pin(prepare(hooks, sender, req)))
    }
}

/// The inner service, cloned for each send.
struct Through<S>(S);

impl<S, ResBody> Sender<ResBody> for Through<S>
where
    S: InnerService<ResBody>,
    ResBody: StreamBody,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReplayBody>) -> Sent<ResBody> {
        let fut = self.0.call(req);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }

    fn fresh(&self) -> Box<dyn Sender<ResBody>> {
        Box::new(Through(self.0.clone()))
    }
}

/// A logical id from the layer's jitter source.
fn fresh_id(hooks: &Hooks) -> u64 {
    let draw = || (hooks.surroundings.jitter().get() * f64::from(u32::MAX)) as u64;
    (draw() << 32) ^ draw()
}

/// The request body as the machine and the driver keep it.
struct Kept {
    /// Buffered (empty when it could not be).
    bytes: Bytes,
    /// The body when it could not be buffered: sent once.
    once: Option<ReplayBody>,
    /// Why it cannot be replayed, when it cannot.
    replay: Option<ReplayDisabled>,
    /// The caller's body failed before anything was sent.
    failed: bool,
}

/// Buffers the request body, up to `cap`, so it can be replayed; a call
/// that streams its body keeps it to be sent once.
async fn keep_body<B>(body: B, call: &RecoveryCall, cap: usize) -> Kept
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let buffered = if call.streams_body() {
        let once = ReplayBody::once(UnsyncBoxBody::new(body.map_err(Into::into)));
        Buffered::NotReplayable(once)
    } else {
        match buffer(body, cap).await {
            Ok(b) => b,
            Err(_) => {
                return Kept {
                    bytes: Bytes::new(),
                    once: None,
                    replay: Some(ReplayDisabled::NotReplayable),
                    failed: true,
                };
            }
        }
    };
    let (bytes, once, replay) = match buffered {
        Buffered::Replayable(bytes) => (bytes, None, None),
        Buffered::NotReplayable(b) => (Bytes::new(), Some(b), Some(ReplayDisabled::NotReplayable)),
        Buffered::TooLarge(b) => (Bytes::new(), Some(b), Some(ReplayDisabled::BodyTooLarge)),
    };
    Kept {
        bytes,
        once,
        replay,
        failed: false,
    }
}

/// The layer's alternates a request of protocol `kind` may use, in order
/// (the machine's target `i` is `alternates[i - 1]`), and the request's
/// own targets when some alternate does not serve it or maps its body:
/// those get this request's body now, so the machine judges each target
/// by what it will be sent.
fn alternates_of(
    hooks: &Hooks,
    kind: &ProtocolKind,
    body: &Bytes,
) -> (Vec<usize>, Option<Vec<Target>>) {
    let alternates: Vec<usize> = (0..hooks.alternates.len())
        .filter(|&i| hooks.alternates[i].serves(kind))
        .collect();
    let own_targets = alternates.len() != hooks.alternates.len()
        || alternates
            .iter()
            .any(|&i| hooks.alternates[i].map_body.is_some());
    let targets = own_targets.then(|| {
        alternates
            .iter()
            .map(|&i| {
                let a = &hooks.alternates[i];
                match &a.map_body {
                    Some(map) => a.target.clone().with_body(map(body)),
                    None => a.target.clone(),
                }
            })
            .collect()
    });
    (alternates, targets)
}

/// Buffers the request body (so it can be replayed) and sets up the
/// machine and its driver.
async fn prepare<B, ResBody>(
    hooks: Arc<Hooks>,
    sender: Box<dyn Sender<ResBody>>,
    mut req: Request<B>,
) -> Result<Driver<ResBody>, RecoveryError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: StreamBody,
{
    let prepaid = req.extensions_mut().remove::<SendCredit>().is_some();
    let mut call = req
        .extensions_mut()
        .remove::<RecoveryCall>()
        .unwrap_or_default();
    let policy = call
        .policy()
        .cloned()
        .unwrap_or_else(|| hooks.policy.clone());
    let (allowance, logical_id) = call.join(policy.max_attempts().get(), fresh_id(&hooks));
    let (head, body) = req.into_parts();
    let Kept {
        bytes,
        once,
        replay,
        failed,
    } = keep_body(body, &call, policy.replay_body_cap()).await;
    let url = head.uri.to_string();
    // A body a layer before this one read (a gateway validates it) is not
    // read again: its fields are kept with it.
    let read = head
        .extensions
        .get::<ReadFields>()
        .and_then(|r| r.fields_of(&bytes));
    let request = match read {
        Some(fields) => RequestFacts::with_fields(head.method.as_str(), &url, &bytes, fields),
        None => RequestFacts::new(head.method.as_str(), &url, &bytes),
    };
    let now = hooks.surroundings.now();
    // A call may name its own protocol (one layer before several).
    let protocol = match call.protocol() {
        Some(kind) => ProtocolChoice::Fixed(kind.clone()),
        None => hooks.protocol.clone(),
    };
    let mut setup = Setup::new(policy, &protocol, request, allowance, logical_id)
        .admission_hook(hooks.admission.is_some())
        .resumable_sse(hooks.sse_resumable)
        .continuation_hook(hooks.continuation.is_some())
        .prepaid_first_send(prepaid)
        .prefill(call.prefill())
        .jitter(hooks.surroundings.jitter_source());
    if let Some(budget) = &hooks.retry_budget {
        setup = setup.retry_budget(Arc::clone(budget));
    }
    if let Some(store) = &hooks.cooldowns {
        let key = match &hooks.cooldown_key {
            Some(key) => key(&head, &bytes),
            None => cooldown::key_of(&url, &request.fields()),
        };
        setup = setup.cooldown(Arc::clone(store), key);
    }
    if let Some(reason) = replay {
        setup = setup.without_replay(reason);
    }
    let (alternates, targets) = alternates_of(&hooks, &protocol.resolve(&url), &bytes);
    if !alternates.is_empty() {
        let own = targets.as_deref().unwrap_or(&hooks.targets);
        setup = setup.alternates(own).context_window(call.context_window());
    }
    #[cfg(feature = "tracing")]
    let telemetry =
        super::telemetry::Telemetry::start(&protocol.resolve(&url), &url, &request.fields(), now);
    let ex = setup.start(now);
    #[cfg(feature = "tracing")]
    telemetry
        .request
        .record("recovery.logical_id", ex.ledger().logical_id());
    let origin = Origin {
        head,
        url,
        targets,
        alternates,
        body: bytes,
        once,
        call,
    };
    let mut driver = Driver::new(
        ex,
        hooks,
        origin,
        sender,
        #[cfg(feature = "tracing")]
        telemetry,
    );
    if failed {
        driver.cancel();
        return Err(driver.unanswered());
    }
    Ok(driver)
}
