//! The request body sent upstream: the client's, streamed as it arrives; or one a plugin
//! read whole during the request phases (request-validation); or the client's with a
//! bounded copy taken as it streams past ([`BodyTap`], proxy-mirror).
//!
//! Every form streams to the upstream unchanged; none buffers more than its cap.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// A request body on its way upstream.
#[derive(Debug)]
pub enum RequestBody {
    /// The client's body, streamed as it arrives (every request, unless a plugin asked for
    /// more).
    Incoming(Incoming),
    /// A whole body a plugin read during the request phases (request-validation), or none.
    Full(Option<Bytes>),
    /// The client's body, copied into a [`BodyTap`] as it streams upstream.
    Tee(Box<Tee>),
}

impl From<Incoming> for RequestBody {
    fn from(b: Incoming) -> Self {
        RequestBody::Incoming(b)
    }
}

impl RequestBody {
    /// An empty body.
    pub fn empty() -> Self {
        RequestBody::Full(None)
    }

    /// `self` with a copy of its bytes handed to `tap` when it ends; the copy is given up
    /// (and the tap told so) as soon as it would grow past the tap's cap.
    pub fn tap(self, tap: BodyTap) -> Self {
        match self {
            RequestBody::Incoming(inner) => {
                if inner.is_end_stream() {
                    tap.finish(Bytes::new());
                    return RequestBody::Incoming(inner);
                }
                if inner.size_hint().lower() > tap.cap as u64 {
                    // NB: announced too large: no copy at all.
                    tap.give_up(TapLoss::TooLarge);
                    return RequestBody::Incoming(inner);
                }
                RequestBody::Tee(Box::new(Tee {
                    inner,
                    copy: BytesMut::new(),
                    tap: Some(tap),
                }))
            }
            RequestBody::Full(data) => {
                let bytes = data.clone().unwrap_or_default();
                if bytes.len() > tap.cap {
                    tap.give_up(TapLoss::TooLarge);
                } else {
                    tap.finish(bytes);
                }
                RequestBody::Full(data)
            }
            RequestBody::Tee(mut tee) => {
                // A second tap on one body: not made by any plugin; the first one wins.
                if tee.tap.is_none() {
                    tee.tap = Some(tap);
                } else {
                    tap.give_up(TapLoss::Incomplete);
                }
                RequestBody::Tee(tee)
            }
        }
    }
}

/// The client's body with a bounded copy.
#[derive(Debug)]
pub struct Tee {
    inner: Incoming,
    copy: BytesMut,
    tap: Option<BodyTap>,
}

impl Drop for Tee {
    fn drop(&mut self) {
        if let Some(tap) = self.tap.take() {
            // The body did not end (the client went away, the upstream failed mid-body).
            tap.give_up(TapLoss::Incomplete);
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RequestBody::Incoming(b) => Pin::new(b).poll_frame(cx),
            RequestBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            RequestBody::Tee(tee) => {
                let polled = Pin::new(&mut tee.inner).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let (Some(data), Some(tap)) = (frame.data_ref(), tee.tap.as_ref()) {
                            if tee.copy.len() + data.len() > tap.cap {
                                tee.copy = BytesMut::new();
                                if let Some(tap) = tee.tap.take() {
                                    tap.give_up(TapLoss::TooLarge);
                                }
                            } else {
                                tee.copy.extend_from_slice(data);
                            }
                        }
                    }
                    Poll::Ready(None) => {
                        if let Some(tap) = tee.tap.take() {
                            tap.finish(std::mem::take(&mut tee.copy).freeze());
                        }
                    }
                    Poll::Ready(Some(Err(_))) => {
                        tee.copy = BytesMut::new();
                        if let Some(tap) = tee.tap.take() {
                            tap.give_up(TapLoss::Incomplete);
                        }
                    }
                    Poll::Pending => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Incoming(b) => b.is_end_stream(),
            RequestBody::Full(data) => data.is_none(),
            RequestBody::Tee(tee) => tee.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Incoming(b) => b.size_hint(),
            RequestBody::Full(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            RequestBody::Tee(tee) => tee.inner.size_hint(),
        }
    }
}

/// Why a [`BodyTap`] got no copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapLoss {
    /// The body is larger than the tap's cap.
    TooLarge,
    /// The body did not end: the client went away, or the upstream failed before taking
    /// all of it.
    Incomplete,
}

/// What a tap's owner receives: the whole body, or why there is none.
pub type TapResult = Result<Bytes, TapLoss>;

/// A plugin's wish for a copy of the request body of at most `cap` bytes, put in the
/// request's extensions by a request phase (proxy-mirror). The request path wraps the body
/// with it; the copy (or why there is none) goes to the tap's receiver once the body has
/// been read to its end by the upstream exchange, never earlier, so that the client's body
/// streams upstream without waiting for the copy.
///
/// NB: the request path honours one tap per request.
#[derive(Debug, Clone)]
pub struct BodyTap {
    cap: usize,
    tx: Arc<Mutex<Option<tokio::sync::oneshot::Sender<TapResult>>>>,
}

impl BodyTap {
    /// A tap of at most `cap` bytes and the receiver of its result. A tap dropped unused
    /// (the request never reached an upstream) closes the receiver.
    pub fn new(cap: usize) -> (Self, tokio::sync::oneshot::Receiver<TapResult>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (
            BodyTap {
                cap,
                tx: Arc::new(Mutex::new(Some(tx))),
            },
            rx,
        )
    }

    fn send(&self, result: TapResult) {
        let tx = match self.tx.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(tx) = tx {
            let _ = tx.send(result);
        }
    }

    /// The body ended: its bytes.
    pub fn finish(&self, body: Bytes) {
        self.send(Ok(body));
    }

    /// No copy, and why.
    pub fn give_up(&self, why: TapLoss) {
        self.send(Err(why));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_full_body_is_handed_over_at_once_within_the_cap() {
        let (tap, rx) = BodyTap::new(5);
        let body = RequestBody::Full(Some(Bytes::from_static(b"hello"))).tap(tap);
        assert_eq!(rx.await.unwrap(), Ok(Bytes::from_static(b"hello")));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");

        let (tap, rx) = BodyTap::new(4);
        let _ = RequestBody::Full(Some(Bytes::from_static(b"hello"))).tap(tap);
        assert_eq!(rx.await.unwrap(), Err(TapLoss::TooLarge));
    }
}
