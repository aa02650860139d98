//! Rust LLM SDKs sending through the recovery stack in-process, against the
//! loopback fault provider over real sockets.
//!
//! async-openai (pinned below, in Cargo.toml) takes a tower service in place
//! of its HTTP client (`Client::with_http_service`, feature `middleware`):
//! `OpenAiHttp` runs each request it builds through `RecoveryLayer` +
//! `ObserveLayer` over [`ReqwestService`], and hands the recovering body back
//! as the SDK's `reqwest::Response`. The SDK then parses the stream as it
//! would any other: a reset before the first token is replayed unseen and
//! the SDK yields the whole answer once; a reset after it ends the SDK's
//! stream with an error, never a silent short answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessage, CreateChatCompletionRequestArgs,
};
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use recovery_core::error::RecoveryError;
use recovery_core::protocol::ProtocolKind;
use recovery_tests::fault::FaultProvider;
use reqwest_recovery::{ReqwestService, client_builder};
use tower::ServiceExt;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReportHandle};

#[path = "support/sdk.rs"]
mod sdk;

use sdk::{ANSWER, Events, LIMIT, Reports, layer};

/// async-openai's HTTP service over the recovery stack `S`.
///
/// The SDK hands over a request factory; its request (a JSON body, already
/// serialized) goes through the stack, which buffers it for replays. The
/// response resolves at commit and its body is the recovering one, wrapped
/// as a body of the SDK's reqwest. The report of each request is kept in
/// `reports`: async-openai turns a stream's transport error into a message
/// (`StreamError::EventStream(String)`), so the typed `RecoveryError` of a
/// failure after commit reaches the caller through the report, not the
/// SDK's error.
#[derive(Clone)]
struct OpenAiHttp<S> {
    stack: S,
    reports: Reports,
}

impl<S, B> tower::Service<HttpRequestFactory> for OpenAiHttp<S>
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
    type Response = reqwest_013::Response;
    type Error = OpenAIError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, OpenAIError>> + Send>>;

    /// Always ready: the recovery stack polls its inner service before
    /// each send.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), OpenAIError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        let stack = self.stack.clone();
        let reports = Arc::clone(&self.reports);
        Box::pin(async move {
            let request = http::Request::<reqwest_013::Body>::try_from(factory.build().await?)?;
            let (parts, body) = request.into_parts();
            // Chat requests carry a serialized JSON body; a multipart upload
            // (a streamed body) is not what this adapter sends.
            let body = body.as_bytes().map(Bytes::copy_from_slice).ok_or_else(|| {
                OpenAIError::InvalidArgument("a streamed request body is not sent here".into())
            })?;
            let response = stack
                .oneshot(http::Request::from_parts(parts, Full::new(body)))
                .await
                .map_err(|e| OpenAIError::Boxed(Box::new(e)))?;
            if let Some(report) = response.extensions().get::<ReportHandle>() {
                reports.lock().unwrap().push(report.clone());
            }
            let (parts, body) = response.into_parts();
            let body = reqwest_013::Body::wrap_stream(body.into_data_stream());
            Ok(reqwest_013::Response::from(http::Response::from_parts(
                parts, body,
            )))
        })
    }
}

/// An async-openai client for `provider`, sending through the recovery
/// stack over a reqwest client.
fn openai(provider: &FaultProvider, layer: RecoveryLayer) -> (Client<OpenAIConfig>, Reports) {
    let stack = tower::ServiceBuilder::new()
        .layer(layer)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
        .service(ReqwestService::new(client_builder().build().unwrap()));
    let reports = Reports::default();
    let config = OpenAIConfig::new()
        .with_api_base(provider.url("/v1"))
        .with_api_key("sk-canary-secret");
    let client = Client::with_config(config).with_http_service(OpenAiHttp {
        stack,
        reports: Arc::clone(&reports),
    });
    (client, reports)
}

/// What the SDK's stream came to.
#[derive(Debug)]
struct Read {
    /// The text of every delta the SDK yielded.
    text: String,
    /// The error that ended the SDK's stream.
    error: Option<OpenAIError>,
    /// Items the SDK yielded after its error (there must be none).
    after_error: usize,
}

/// Streams one chat completion through `client` as an application does.
async fn chat(client: &Client<OpenAIConfig>) -> Read {
    let request = CreateChatCompletionRequestArgs::default()
        .model("m")
        .messages([ChatCompletionRequestUserMessage::from("canary-prompt").into()])
        .build()
        .unwrap();
    tokio::time::timeout(LIMIT, async {
        let mut stream = client
            .chat()
            .create_stream(request)
            .await
            .expect("the stream opens");
        let mut read = Read {
            text: String::new(),
            error: None,
            after_error: 0,
        };
        while let Some(item) = stream.next().await {
            match item {
                Ok(_) if read.error.is_some() => read.after_error += 1,
                Ok(chunk) => {
                    for choice in chunk.choices {
                        read.text
                            .push_str(choice.delta.content.as_deref().unwrap_or(""));
                    }
                }
                Err(e) if read.error.is_none() => read.error = Some(e),
                Err(_) => read.after_error += 1,
            }
        }
        read
    })
    .await
    .expect("hung")
}

/// What every send carried ([`sdk::check_sends`]), and the SDK's prompt.
async fn check_sends(provider: &FaultProvider, expected: u64) {
    let first = sdk::check_sends(provider, expected).await;
    assert_eq!(first["messages"][0]["content"], "canary-prompt");
}

#[tokio::test]
async fn async_openai_reset_before_the_first_token_yields_the_whole_answer_once() {
    // The first attempt sends its head and the role-only event (no semantic
    // output), then resets: held back, invisible to the SDK, replayed.
    let provider = sdk::reset_before_the_first_token().await;
    let events = Events::default();
    let (client, reports) = openai(&provider, layer(&events));
    let read = chat(&client).await;
    // The pool's idle connection goes with the client.
    drop(client);
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!(read.text, ANSWER, "the whole answer, once");
    check_sends(&provider, 2).await;
    sdk::check_replayed_once(&reports, &events);
}

#[tokio::test]
async fn async_openai_reset_after_the_first_token_ends_the_stream_with_an_error() {
    // "Hello" is out when the connection resets: no replay (it would repeat
    // the answer), and the SDK's stream ends with its error.
    let provider = sdk::reset_after_the_first_token().await;
    let events = Events::default();
    let (client, reports) = openai(&provider, layer(&events));
    let read = chat(&client).await;
    // The pool's idle connection goes with the client.
    drop(client);
    assert_eq!(read.text, "Hello", "the committed prefix, nothing more");
    let error = read.error.expect("an error, not a silent short answer");
    assert!(
        matches!(error, OpenAIError::StreamError(_)),
        "the SDK's stream error: {error:?}"
    );
    assert_eq!(read.after_error, 0, "the error ends the stream");
    check_sends(&provider, 1).await;
    // The typed failure, through the report the adapter kept.
    sdk::check_interrupted(&reports, &events);
}
