//! A reconnect: the log after the client's last event, then the live rest
//! until the stream finishes; a log that lost the rest says so with the
//! protocol's error event.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::{ErrorClass, StreamFailure, write_error_event};
use tokio::sync::OwnedSemaphorePermit;

use super::registry::{AttachError, Attached, Live, READ_WAIT, READER_LEASE, Streams};
use crate::identity::StreamKey;
use crate::log::LogError;
use crate::logs::Field;

impl Streams {
    /// A reconnect after `after`: `Err(LogError::Unknown)` for a stream
    /// the log does not have (never opened, or expired).
    pub(crate) async fn attach(
        self: &Arc<Self>,
        key: &StreamKey,
        after: u64,
        fallback_protocol: ProtocolKind,
    ) -> Result<Attached, AttachError> {
        let Ok(place) = Arc::clone(&self.readers).try_acquire_owned() else {
            return Err(AttachError::Busy);
        };
        let first = self
            .log
            .read(key.as_str(), after, Duration::ZERO)
            .await
            .map_err(AttachError::Log)?;
        let live = self.live(key);
        if let Some(l) = &live {
            let max = self.max_readers_per_stream;
            let taken = l
                .reconnects
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                });
            if taken.is_err() {
                return Err(AttachError::Busy);
            }
        }
        let (protocol, content_type) = match &live {
            Some(l) => (l.protocol.clone(), l.content_type.clone()),
            None => (
                fallback_protocol,
                HeaderValue::from_static("text/event-stream"),
            ),
        };
        let guard = live.map(|l| {
            l.readers.send_modify(|n| *n += 1);
            ReaderGuard(l)
        });
        self.metrics.reconnect();
        self.logger.info(
            "downstream_reconnect",
            "serving a reconnect from the stream log",
            &[
                ("stream", Field::Str(key.digest())),
                ("after", Field::U64(after)),
            ],
        );
        let reader = Reader {
            streams: Arc::clone(self),
            key: key.clone(),
            after,
            pending: Some(first),
            protocol,
            done: false,
            local: guard,
            _place: place,
        };
        let stream = futures_util::stream::unfold(reader, |mut r| async move {
            let chunk = r.next_chunk().await?;
            Some((Ok(chunk), r))
        });
        Ok(Attached {
            body: crate::body::streaming(stream),
            content_type,
        })
    }
}

/// Counts a reconnect among the stream's readers while it lives.
pub(super) struct ReaderGuard(pub(super) Arc<Live>);

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.0.reconnects.fetch_sub(1, Ordering::AcqRel);
        self.0.readers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A reconnect reading the log.
pub(super) struct Reader {
    pub(super) streams: Arc<Streams>,
    pub(super) key: StreamKey,
    pub(super) after: u64,
    pub(super) pending: Option<crate::log::Read>,
    pub(super) protocol: ProtocolKind,
    pub(super) done: bool,
    pub(super) local: Option<ReaderGuard>,
    /// Its place among all reconnected readers.
    pub(super) _place: OwnedSemaphorePermit,
}

impl Reader {
    /// The next bytes for the client, `None` at the end.
    pub(super) async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let read = if let Some(r) = self.pending.take() {
                Ok(r)
            } else {
                // A reconnect on another instance than the one running the
                // stream says, through the log, that it reads.
                if self.local.is_none() {
                    let _ = self
                        .streams
                        .log
                        .reading(self.key.as_str(), READER_LEASE)
                        .await;
                }
                self.streams
                    .log
                    .read(self.key.as_str(), self.after, READ_WAIT)
                    .await
            };
            match read {
                Ok(read) => {
                    if let Some(last) = read.entries.last() {
                        self.after = last.seq;
                        if read.finished {
                            self.pending = Some(crate::log::Read {
                                entries: Vec::new(),
                                finished: true,
                            });
                        }
                        let mut out =
                            Vec::with_capacity(read.entries.iter().map(|e| e.event.len()).sum());
                        for e in &read.entries {
                            out.extend_from_slice(&e.event);
                        }
                        return Some(Bytes::from(out));
                    }
                    if read.finished {
                        self.done = true;
                        let short = self
                            .streams
                            .truncated_at(&self.key)
                            .is_some_and(|at| self.after >= at);
                        if short {
                            return Some(self.error(
                                "this stream outgrew the gateway's stream log; its rest cannot be replayed",
                            ));
                        }
                        return None;
                    }
                }
                Err(e) => {
                    self.done = true;
                    let text = match e {
                        LogError::Unknown => {
                            "the stream expired from the gateway's log before it finished"
                                .to_owned()
                        }
                        other => format!("the gateway's stream log failed: {other}"),
                    };
                    return Some(self.error(&text));
                }
            }
        }
    }

    fn error(&self, message: &str) -> Bytes {
        let mut out = Vec::new();
        write_error_event(
            &self.protocol,
            &StreamFailure::new(ErrorClass::Server, message),
            &mut out,
        );
        Bytes::from(out)
    }
}
