//! `ReqwestService`: a `reqwest::Client` as the tower service under the
//! recovery layers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower_service::Service;

use crate::BoxError;
use crate::body::{ResponseBody, request_body};
use crate::error::Error;

/// A [`reqwest::Client`] as a tower [`Service`] of `http` requests, to put
/// under [`RecoveryLayer`](tower_recovery::RecoveryLayer) and
/// [`ObserveLayer`](tower_recovery::ObserveLayer) in place of a hyper-util
/// client: the sends then use reqwest's TLS, proxies, DNS and pools.
///
/// Each call turns the `http::Request` into a `reqwest::Request` (method,
/// URL, version, headers, extensions, body) and the `reqwest::Response`
/// into an `http::Response` of a [`ResponseBody`]; the response URL is in
/// its extensions as a [`reqwest::Url`]. Failures are typed [`Error`]s whose
/// source chain carries hyper's and the socket's errors, so the recovery
/// layer judges a reset or a refused connection as it does over hyper-util.
///
/// Build the client so that it decides nothing behind recovery's back:
/// [`client_builder`](crate::client_builder) turns redirects off (reqwest
/// follows them by default, and a `301`/`302` turns a POST into a GET), and
/// leave reqwest's total `timeout` unset for streamed requests (it would cut
/// a long generation; the policy's stall timers bound a silent stream).
#[derive(Clone)]
pub struct ReqwestService {
    client: reqwest::Client,
}

impl ReqwestService {
    /// The service over `client` (clones of it share its pool).
    pub fn new(client: reqwest::Client) -> Self {
        ReqwestService { client }
    }

    /// The client the service sends with.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

impl fmt::Debug for ReqwestService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestService").finish_non_exhaustive()
    }
}

impl From<reqwest::Client> for ReqwestService {
    fn from(client: reqwest::Client) -> Self {
        ReqwestService::new(client)
    }
}

impl<B> Service<http::Request<B>> for ReqwestService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<ResponseBody>;
    type Error = Error;
    type Future = ResponseFuture;

    /// Always ready: a reqwest client takes any number of requests and
    /// queues for connections in its pool.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> ResponseFuture {
        match to_reqwest(req) {
            Ok(request) => {
                let sent = self.client.execute(request);
                ResponseFuture::new(async move {
                    sent.await.map(from_reqwest).map_err(Error::from_reqwest)
                })
            }
            Err(e) => ResponseFuture::new(std::future::ready(Err(e))),
        }
    }
}

/// The `reqwest::Request` of an `http::Request`.
pub(crate) fn to_reqwest<B>(req: http::Request<B>) -> Result<reqwest::Request, Error>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    reqwest::Request::try_from(req.map(request_body)).map_err(Error::from_reqwest)
}

/// The `http::Response` of a `reqwest::Response`, its URL in the extensions.
pub(crate) fn from_reqwest(response: reqwest::Response) -> http::Response<ResponseBody> {
    let url = response.url().clone();
    let response: http::Response<reqwest::Body> = response.into();
    let (mut parts, body) = response.into_parts();
    parts.extensions.insert(url);
    http::Response::from_parts(parts, ResponseBody::new(body))
}

/// The response future of [`ReqwestService`].
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<http::Response<ResponseBody>, Error>> + Send>>,
}

impl ResponseFuture {
    pub(crate) fn new(
        future: impl Future<Output = Result<http::Response<ResponseBody>, Error>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<ResponseBody>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}
