//! rig-core sending through the recovery stack in-process, against the
//! loopback fault provider over real sockets.
//!
//! rig-core's providers send through any `HttpClientExt` (a provider
//! configuration's `connect(http)`, or a client's `with_http(http)`), and
//! without its `reqwest` feature it has no client of its own. `RigHttp`
//! implements it over `RecoveryLayer` + `ObserveLayer` over
//! `reqwest_recovery::ReqwestService`: a reset before the first token is
//! replayed unseen and rig yields the whole answer once; a reset after it
//! ends rig's stream with its error, which holds the typed `RecoveryError`.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use recovery_core::error::RecoveryError;
use recovery_core::outcome::Outcome;
use recovery_core::protocol::ProtocolKind;
use recovery_tests::fault::FaultProvider;
use reqwest_recovery::{ReqwestService, client_builder, recovery_error};
use rig_core::completion::{AssistantContent, CompletionRequest};
use rig_core::error::ProviderError;
use rig_core::http_client::{
    self, BoxedStream, HttpClientExt, LazyBody, MultipartForm, Request, Response, StreamingResponse,
};
use rig_core::providers::openai::OpenAIConfig;
use rig_core::streaming::{Item, StreamEvent};
use rig_core::wasm_compat::WasmCompatSend;
use tower::ServiceExt;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReportHandle};

#[path = "../../tests/support/sdk.rs"]
mod sdk;

use sdk::{ANSWER, Events, LIMIT, Reports, layer};

/// rig's HTTP transport over the recovery stack `S`.
///
/// rig hands over a request whose body is already bytes; the stack buffers
/// it for replays, resolves at commit, and its recovering body is rig's
/// stream of chunks. A failure with no answer, and one after commit, reach
/// rig as `http_client::Error::Instance` holding the `RecoveryError`; rig
/// keeps it (`ProviderError::Http`). A non-success reply is returned as a
/// response: rig reads the provider's error from it.
#[derive(Clone)]
struct RigHttp<S> {
    stack: S,
    reports: Reports,
}

impl<S, B> RigHttp<S>
where
    S: tower::Service<
            http::Request<Full<Bytes>>,
            Response = http::Response<B>,
            Error = RecoveryError,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes, Error = RecoveryError> + Send + 'static,
{
    /// Sends `req` through the stack; the response resolves at commit.
    fn open(
        &self,
        req: Request<Bytes>,
    ) -> impl Future<Output = http_client::Result<http::Response<B>>> + Send + 'static {
        let stack = self.stack.clone();
        let reports = Arc::clone(&self.reports);
        async move {
            let response = stack
                .oneshot(req.map(Full::new))
                .await
                .map_err(http_client::Error::instance)?;
            if let Some(report) = response.extensions().get::<ReportHandle>() {
                reports.lock().unwrap().push(report.clone());
            }
            Ok(response)
        }
    }
}

impl<S, B> HttpClientExt for RigHttp<S>
where
    S: tower::Service<
            http::Request<Full<Bytes>>,
            Response = http::Response<B>,
            Error = RecoveryError,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes, Error = RecoveryError> + Send + 'static,
{
    fn send<T, U>(
        &self,
        req: Request<T>,
    ) -> impl Future<Output = http_client::Result<Response<LazyBody<U>>>> + WasmCompatSend + 'static
    where
        T: Into<Bytes> + WasmCompatSend,
        U: From<Bytes> + WasmCompatSend + 'static,
    {
        let opened = self.open(req.map(Into::into));
        async move {
            let (parts, body) = opened.await?.into_parts();
            let body: LazyBody<U> = Box::pin(async move {
                let bytes = body
                    .collect()
                    .await
                    .map_err(http_client::Error::instance)?
                    .to_bytes();
                Ok(U::from(bytes))
            });
            Ok(Response::from_parts(parts, body))
        }
    }

    /// Not what these tests send: a multipart upload is refused before
    /// anything is sent.
    fn send_multipart<U>(
        &self,
        _req: Request<MultipartForm>,
    ) -> impl Future<Output = http_client::Result<Response<LazyBody<U>>>> + WasmCompatSend + 'static
    where
        U: From<Bytes> + WasmCompatSend + 'static,
    {
        std::future::ready(Err(http_client::Error::instance(std::io::Error::other(
            "multipart is not sent through this transport",
        ))))
    }

    fn send_streaming<T>(
        &self,
        req: Request<T>,
    ) -> impl Future<Output = http_client::Result<StreamingResponse>> + WasmCompatSend
    where
        T: Into<Bytes> + WasmCompatSend,
    {
        let opened = self.open(req.map(Into::into));
        async move {
            let (parts, body) = opened.await?.into_parts();
            let chunks: BoxedStream = Box::pin(
                body.into_data_stream()
                    .map(|chunk| chunk.map_err(http_client::Error::instance)),
            );
            Ok(Response::from_parts(parts, chunks))
        }
    }
}

/// A rig OpenAI client for `provider`, sending through the recovery stack
/// over a reqwest client.
fn rig(
    provider: &FaultProvider,
    layer: RecoveryLayer,
) -> (rig_core::providers::openai::OpenAI, Reports) {
    let stack = tower::ServiceBuilder::new()
        .layer(layer)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
        .service(ReqwestService::new(client_builder().build().unwrap()));
    let reports = Reports::default();
    let client = OpenAIConfig::new("sk-canary-secret")
        .with_base_url(provider.url("/v1"))
        .connect(RigHttp {
            stack,
            reports: Arc::clone(&reports),
        });
    (client, reports)
}

/// What rig's stream came to.
#[derive(Debug)]
struct Read {
    /// The text of every fragment rig yielded.
    text: String,
    /// The error that ended rig's stream.
    error: Option<ProviderError>,
    /// Items rig yielded after its error (there must be none).
    after_error: usize,
    /// The response rig folded the stream into, when it ended whole.
    response: Option<Result<String, ProviderError>>,
}

/// Streams one chat completion through `client` as an application does.
async fn chat(client: &rig_core::providers::openai::OpenAI) -> Read {
    let model = client.chat("m");
    tokio::time::timeout(LIMIT, async {
        let mut stream = model
            .stream(CompletionRequest::new("canary-prompt"))
            .expect("the request encodes");
        let mut read = Read {
            text: String::new(),
            error: None,
            after_error: 0,
            response: None,
        };
        while let Some(item) = stream.next().await {
            match item {
                _ if read.error.is_some() => read.after_error += 1,
                Ok(Item::Event(StreamEvent::Text { text, .. })) => read.text.push_str(&text),
                Ok(_) => {}
                Err(e) => read.error = Some(e),
            }
        }
        if read.error.is_none() {
            read.response = Some(stream.finish().await.map(|r| {
                r.choice
                    .iter()
                    .filter_map(|c| match c {
                        AssistantContent::Text(t) => Some(t.text.as_str()),
                        _ => None,
                    })
                    .collect()
            }));
        }
        read
    })
    .await
    .expect("hung")
}

/// The `RecoveryError` inside rig's error, if any.
fn rig_recovery_error(error: &ProviderError) -> Option<&RecoveryError> {
    match error {
        ProviderError::Http(http) => recovery_error(&**http),
        _ => None,
    }
}

/// What every send carried ([`sdk::check_sends`]), and rig's model.
async fn check_sends(provider: &FaultProvider, expected: u64) {
    let first = sdk::check_sends(provider, expected).await;
    assert_eq!(first["model"], "m");
}

#[tokio::test]
async fn rig_reset_before_the_first_token_yields_the_whole_answer_once() {
    // The first attempt sends its head and the role-only event (no semantic
    // output), then resets: held back, invisible to rig, replayed.
    let provider = sdk::reset_before_the_first_token().await;
    let events = Events::default();
    let (client, reports) = rig(&provider, layer(&events));
    let read = chat(&client).await;
    // The pool's idle connection goes with the client.
    drop(client);
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!(read.text, ANSWER, "the whole answer, once");
    let response = read.response.expect("folded").expect("rig's response");
    assert_eq!(response, ANSWER);
    check_sends(&provider, 2).await;
    sdk::check_replayed_once(&reports, &events);
}

#[tokio::test]
async fn rig_reset_after_the_first_token_ends_the_stream_with_the_typed_error() {
    // "Hello" is out when the connection resets: no replay (it would repeat
    // the answer), and rig's stream ends with its error, which holds ours.
    let provider = sdk::reset_after_the_first_token().await;
    let events = Events::default();
    let (client, reports) = rig(&provider, layer(&events));
    let read = chat(&client).await;
    drop(client);
    assert_eq!(read.text, "Hello", "the committed prefix, nothing more");
    let error = read.error.expect("an error, not a silent short answer");
    assert_eq!(read.after_error, 0, "the error ends the stream");
    let typed = rig_recovery_error(&error)
        .unwrap_or_else(|| panic!("rig's error holds the RecoveryError: {error:?}"));
    assert!(
        matches!(
            typed.outcome(),
            Outcome::Interrupted {
                committed: true,
                ..
            }
        ),
        "{typed}"
    );
    check_sends(&provider, 1).await;
    let report = sdk::check_interrupted(&reports, &events);
    assert_eq!(typed.outcome(), report.outcome.as_ref().unwrap());
}
