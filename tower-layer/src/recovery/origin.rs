//! The logical request as the caller sent it, and the request each kind of
//! send writes from it: the original (to the request's own endpoint or an
//! alternate, whose URL, headers and body it rewrites), a declared prefill
//! continuation, a provider-native resume.

use bytes::Bytes;
use http::Request;
use recovery_core::call::RecoveryCall;
use recovery_core::failover::Target;
use recovery_core::resume::{BODY_HEADERS, ResumeRequest};

use super::Alternate;
use crate::request_body::ReplayBody;

/// The logical request as the caller sent it.
pub(crate) struct Origin {
    pub(crate) head: http::request::Parts,
    /// The request's URL, as the machine was given it.
    pub(crate) url: String,
    /// This request's own targets, when an alternate maps its body or
    /// some alternates do not serve its protocol.
    pub(crate) targets: Option<Vec<Target>>,
    /// The layer's alternates this request may use, in order: the
    /// machine's target `i` is the layer's alternate `alternates[i - 1]`.
    pub(crate) alternates: Vec<usize>,
    pub(crate) body: Bytes,
    /// The body when it could not be buffered: sent once.
    pub(crate) once: Option<ReplayBody>,
    pub(crate) call: RecoveryCall,
}

/// A send's request could not be written (an alternate's URL or a resume's
/// header is not one `http` takes): the send fails as a rejected one.
pub(crate) struct Unwritable;

impl Origin {
    /// The request's own target `i` (1 for the first alternate), when
    /// alternates map its body.
    fn target(&self, i: usize) -> Option<&Target> {
        self.targets.as_ref()?.get(i.checked_sub(1)?)
    }

    /// The body alternate `alt` (the machine's target `i`) sends, its
    /// headers fitted to it.
    fn body_for(&self, alt: &Alternate, i: usize, head: &mut http::request::Parts) -> Bytes {
        let target = self.target(i).unwrap_or(&alt.target);
        Alternate::body(target, head, &self.body)
    }

    /// The head as the caller sent it, pointed at `alt` when there is one.
    fn head_for(&self, alt: Option<&Alternate>) -> Result<http::request::Parts, Unwritable> {
        let mut head = self.head.clone();
        if let Some(alt) = alt {
            let url = alt.target.rewrite_url(&self.url);
            alt.head(&mut head, &url, &self.url)
                .map_err(|()| Unwritable)?;
        }
        Ok(head)
    }

    /// The original request, to its own endpoint or to alternate `alt`
    /// (the machine's target `i`).
    pub(crate) fn original(
        &mut self,
        alt: Option<&Alternate>,
        i: usize,
    ) -> Result<Request<ReplayBody>, Unwritable> {
        let Some(alt) = alt else {
            let body = self
                .once
                .take()
                .unwrap_or_else(|| ReplayBody::full(self.body.clone()));
            return Ok(Request::from_parts(self.head.clone(), body));
        };
        let mut head = self.head_for(Some(alt))?;
        let body = self.body_for(alt, i, &mut head);
        Ok(Request::from_parts(head, ReplayBody::full(body)))
    }

    /// A prefill continuation: the request of the target it goes to, with
    /// the body the machine wrote.
    pub(crate) fn prefill(
        &self,
        alt: Option<&Alternate>,
        body: Bytes,
    ) -> Result<Request<ReplayBody>, Unwritable> {
        let mut head = self.head_for(alt)?;
        if head.headers.contains_key(http::header::CONTENT_LENGTH) {
            head.headers
                .insert(http::header::CONTENT_LENGTH, body.len().into());
        }
        Ok(Request::from_parts(head, ReplayBody::full(body)))
    }

    /// A provider-native resume of the committed stream on the target in
    /// use (`alt`, the machine's target `i`, or the request's own).
    pub(crate) fn resume(
        &self,
        alt: Option<&Alternate>,
        i: usize,
        resume: &ResumeRequest,
    ) -> Result<Request<ReplayBody>, Unwritable> {
        let mut head = self.head.clone();
        if let Ok(method) = http::Method::from_bytes(resume.method.as_bytes()) {
            head.method = method;
        }
        match alt {
            Some(alt) => alt.head(&mut head, &resume.url, &self.url),
            None => resume.url.parse().map(|uri| head.uri = uri).map_err(drop),
        }
        .map_err(|()| Unwritable)?;
        if let Some((name, value)) = &resume.header {
            let value = http::HeaderValue::from_str(value).map_err(|_| Unwritable)?;
            head.headers.insert(*name, value);
        }
        let body = match (resume.with_body, alt) {
            (true, Some(alt)) => self.body_for(alt, i, &mut head),
            (true, None) => self.body.clone(),
            (false, _) => {
                for name in BODY_HEADERS {
                    head.headers.remove(name);
                }
                Bytes::new()
            }
        };
        Ok(Request::from_parts(head, ReplayBody::full(body)))
    }
}
