//! `RecoveryMiddleware`: the recovery layers as a `reqwest_middleware`
//! middleware, for code built on `ClientWithMiddleware`.

use std::convert::Infallible;
use std::fmt;
use std::pin::pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{Either, select};
use http::Extensions;
use http_body::Body;
use recovery_core::call::RecoveryCall;
use recovery_core::error::RecoveryError;
use reqwest_middleware::{Middleware, Next};
use tokio::sync::{mpsc, oneshot};
use tower_layer::Layer;
use tower_recovery::{ObserveLayer, RecoveryLayer};
use tower_service::Service;

use crate::BoxError;
use crate::body::{DataStream, ResponseBody};
use crate::error::{Error, ErrorKind};
use crate::service::{ResponseFuture, from_reqwest, to_reqwest};

/// The recovery of a [`RecoveryLayer`] (and, optionally, the decoding of an
/// [`ObserveLayer`]) as a [`reqwest_middleware::Middleware`].
///
/// Same policy, same decisions, same report as the tower stack: each
/// request runs through the layer's machine, and every send it makes (the
/// first, and each replay) runs the rest of the middleware chain and the
/// client, with the request rebuilt from the buffered body. The response
/// resolves at commit; its body is the stitched recovering body (held-back
/// prefix, then the stream; a failure after commit is a body error whose
/// source chain holds a typed [`RecoveryError`], see
/// [`recovery_error`](crate::recovery_error)). The
/// [`ReportHandle`](tower_recovery::ReportHandle) is in the response
/// [extensions](reqwest::Response::extensions). A request that gets no
/// answer at all fails with a `reqwest_middleware::Error::Middleware`
/// holding the `RecoveryError` ([`middleware_error`]).
///
/// Put it first in the chain (outermost) and turn off retry middlewares
/// behind it, for the reasons the tower layer order gives. A
/// [`RecoveryCall`] in the request's middleware extensions (for example
/// `RequestBuilder::with_extension`) is the call's cancellation and policy,
/// as it is in a tower request's extensions.
///
/// # Example
///
/// ```no_run
/// use reqwest_recovery::{RecoveryMiddleware, client_builder, recovery_error};
/// use tower_recovery::core::{policy::RecoveryPolicy, protocol::ProtocolKind};
/// use tower_recovery::{ObserveLayer, RecoveryLayer, ReportHandle};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let recovery = RecoveryMiddleware::new(RecoveryLayer::new(RecoveryPolicy::default()))
///     .observe(ObserveLayer::new(ProtocolKind::OpenAiChat));
/// let client = reqwest_middleware::ClientBuilder::new(client_builder().build()?)
///     .with(recovery)
///     .build();
/// let mut response = client
///     .post("http://127.0.0.1:11434/v1/chat/completions")
///     .header("content-type", "application/json")
///     .body(r#"{"model":"m","stream":true,"messages":[]}"#)
///     .send()
///     .await?;
/// let report = response.extensions().get::<ReportHandle>().cloned();
/// loop {
///     match response.chunk().await {
///         Ok(Some(bytes)) => print!("{}", String::from_utf8_lossy(&bytes)),
///         Ok(None) => break,
///         Err(e) => {
///             // Not a silent truncation: the typed failure, with its evidence.
///             eprintln!("{:?}", recovery_error(&e).map(|r| r.outcome()));
///             break;
///         }
///     }
/// }
/// if let Some(report) = report {
///     eprintln!("{:?}", report.report().outcome);
/// }
/// # Ok(())
/// # }
/// ```
///
/// # After commit
///
/// `Next` borrows the chain for the duration of `handle` only, and `handle`
/// returns at commit, while the body still streams. So sends run through
/// `Next` from inside `handle` (the recovery driver's sends cross to it over
/// a one-slot channel), and a send asked for after `handle` returned, which
/// is only ever a resume of a committed stream (OpenAI Responses background
/// streams, `with_resumable_sse`, `with_continuation`), finds the chain gone:
/// it fails as not ready before anything is sent (the report shows a resume
/// attempt that failed connecting, never accepted), and the body ends with
/// a typed `interrupted` error (`resume_failed`). Replay before commit, hold-back and typed
/// failures are unaffected. Where resumes matter, use the tower stack over
/// [`ReqwestService`](crate::ReqwestService), whose sends need no borrow.
pub struct RecoveryMiddleware<
    T = tower_recovery::TokioTiming,
    C = recovery_core::timing::AlwaysOnline,
> {
    recovery: RecoveryLayer<T, C>,
    observe: Option<ObserveLayer>,
}

impl<T, C> RecoveryMiddleware<T, C> {
    /// The middleware with `recovery`'s policy, hooks, budget and
    /// cooldowns; its clones share the budget and cooldowns with the layer.
    /// Without an [`ObserveLayer`] the machine decodes the stream by itself,
    /// with the layer's protocol (set with `with_protocol`, or guessed from
    /// each request's URL).
    pub fn new(recovery: RecoveryLayer<T, C>) -> Self {
        RecoveryMiddleware {
            recovery,
            observe: None,
        }
    }

    /// Decodes every attempt's body with `observe`, which then names the
    /// protocol, and puts its `ObserveHandle` in each attempt's response.
    #[must_use]
    pub fn observe(mut self, observe: ObserveLayer) -> Self {
        self.observe = Some(observe);
        self
    }
}

impl<T, C> fmt::Debug for RecoveryMiddleware<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveryMiddleware")
            .field("recovery", &self.recovery)
            .field("observe", &self.observe)
            .finish()
    }
}

/// The `RecoveryError` a request through [`RecoveryMiddleware`] failed with
/// when it got no answer (every send refused, a permanent failure before a
/// head, cancellation): `None` for any other error.
pub fn middleware_error(err: &reqwest_middleware::Error) -> Option<&RecoveryError> {
    match err {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<RecoveryError>(),
        reqwest_middleware::Error::Reqwest(e) => crate::recovery_error(e),
    }
}

#[async_trait::async_trait]
impl<T, C> Middleware for RecoveryMiddleware<T, C>
where
    T: Send + Sync + 'static,
    C: Send + Sync + 'static,
{
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let url = req.url().clone();
        let mut req = http::Request::<reqwest::Body>::try_from(req)?;
        if let Some(call) = extensions.remove::<RecoveryCall>() {
            req.extensions_mut().insert(call);
        }
        let (jobs, queue) = mpsc::channel(1);
        let bridge = Bridge { jobs };
        let response = match &self.observe {
            Some(observe) => {
                let stack = self.recovery.layer(observe.layer(bridge));
                run(stack, req, queue, next, extensions)
                    .await
                    .map(|r| into_reqwest(r, url))
            }
            None => run(self.recovery.layer(bridge), req, queue, next, extensions)
                .await
                .map(|r| into_reqwest(r, url)),
        };
        response.map_err(reqwest_middleware::Error::middleware)
    }
}

/// Runs one request through the recovery `stack` up to its response, and
/// meanwhile the sends it asks for through `next`.
async fn run<S, B>(
    mut stack: S,
    req: http::Request<reqwest::Body>,
    queue: mpsc::Receiver<Job>,
    next: Next<'_>,
    extensions: &mut Extensions,
) -> Result<http::Response<B>, RecoveryError>
where
    S: Service<http::Request<reqwest::Body>, Response = http::Response<B>, Error = RecoveryError>,
{
    // Ready at once (the recovery service polls the inner service's
    // readiness before each send, not here); polled for the contract.
    std::future::poll_fn(|cx| stack.poll_ready(cx)).await?;
    let response = pin!(stack.call(req));
    let serving = pin!(serve(queue, next, extensions));
    match select(response, serving).await {
        Either::Left((response, _)) => response,
        Either::Right((never, _)) => match never {},
    }
}

/// Runs each send through the rest of the chain, one at a time; a send
/// whose caller stopped waiting (the attempt was abandoned) is dropped.
async fn serve(
    mut queue: mpsc::Receiver<Job>,
    next: Next<'_>,
    extensions: &mut Extensions,
) -> Infallible {
    while let Some(Job { request, mut reply }) = queue.recv().await {
        let answer = {
            let sent = next.clone().run(request, extensions);
            let abandoned = pin!(reply.closed());
            match select(sent, abandoned).await {
                Either::Left((answer, _)) => Some(answer),
                Either::Right(((), _)) => None,
            }
        };
        if let Some(answer) = answer {
            // The attempt may have been abandoned meanwhile: nothing to do.
            let _ = reply.send(answer);
        }
    }
    // Every sender is gone: only the response is left to wait for.
    std::future::pending().await
}

/// One send for the chain, and where its answer goes.
struct Job {
    request: reqwest::Request,
    reply: oneshot::Sender<reqwest_middleware::Result<reqwest::Response>>,
}

/// The inner service of the recovery stack inside the middleware: hands
/// each send to `handle`, which runs it through `Next`. It owns no borrow,
/// as the recovery driver needs.
#[derive(Clone)]
struct Bridge {
    jobs: mpsc::Sender<Job>,
}

impl fmt::Debug for Bridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bridge")
            .field("open", &!self.jobs.is_closed())
            .finish()
    }
}

impl<B> Service<http::Request<B>> for Bridge
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<ResponseBody>;
    type Error = Error;
    type Future = ResponseFuture;

    /// Not ready once `handle` returned: the send is refused before it is
    /// made.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if self.jobs.is_closed() {
            return Poll::Ready(Err(Error::new(ErrorKind::ChainEnded, None)));
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> ResponseFuture {
        let jobs = self.jobs.clone();
        let request = to_reqwest(req);
        ResponseFuture::new(async move {
            let request = request?;
            let (reply, answer) = oneshot::channel();
            let ended = || Error::new(ErrorKind::ChainEnded, None);
            jobs.send(Job { request, reply })
                .await
                .map_err(|_| ended())?;
            match answer.await.map_err(|_| ended())? {
                Ok(response) => Ok(from_reqwest(response)),
                Err(e) => Err(from_middleware(e)),
            }
        })
    }
}

/// A chain's error, typed; a reqwest error inside a middleware error is
/// unwrapped so that recovery reads its cause chain.
fn from_middleware(err: reqwest_middleware::Error) -> Error {
    match err {
        reqwest_middleware::Error::Reqwest(e) => Error::from_reqwest(e),
        reqwest_middleware::Error::Middleware(e) => match e.downcast::<reqwest::Error>() {
            Ok(e) => Error::from_reqwest(e),
            Err(e) => {
                let source: BoxError = e.into();
                Error::new(ErrorKind::Middleware, Some(source))
            }
        },
    }
}

/// The `reqwest::Response` of the recovery stack's response: its body is
/// the recovering body, its URL the committed attempt's.
fn into_reqwest<B>(response: http::Response<B>, requested: reqwest::Url) -> reqwest::Response
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    use reqwest::ResponseBuilderExt as _;

    let (mut parts, body) = response.into_parts();
    let url = parts
        .extensions
        .remove::<reqwest::Url>()
        .unwrap_or(requested);
    if let Ok(marker) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(marker.into_parts().0.extensions);
    }
    let body = reqwest::Body::wrap_stream(DataStream::new(body));
    reqwest::Response::from(http::Response::from_parts(parts, body))
}
