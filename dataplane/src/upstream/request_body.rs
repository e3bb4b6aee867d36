//! The request body sent upstream: the client's, streamed as it arrives; or one a plugin
//! read whole during the request phases (request-validation); or the client's with
//! bounded copies taken as it streams past ([`BodyTap`]: proxy-mirror's whole body, a
//! logger's first bytes).
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

    /// `self` with a copy of its bytes handed to `tap` when it ends. A whole-body tap
    /// gives the copy up (and is told so) as soon as it would grow past its cap; a
    /// truncating one gets the first `cap` bytes.
    pub fn tap(self, tap: BodyTap) -> Self {
        match self {
            RequestBody::Incoming(inner) => {
                if inner.is_end_stream() {
                    tap.finish(Bytes::new());
                    return RequestBody::Incoming(inner);
                }
                if !tap.truncate && inner.size_hint().lower() > tap.cap as u64 {
                    // NB: announced too large: no copy at all.
                    tap.give_up(TapLoss::TooLarge);
                    return RequestBody::Incoming(inner);
                }
                RequestBody::Tee(Box::new(Tee {
                    inner,
                    copy: BytesMut::new(),
                    seen: 0,
                    taps: vec![tap],
                }))
            }
            RequestBody::Full(data) => {
                let bytes = data.clone().unwrap_or_default();
                if bytes.len() <= tap.cap {
                    tap.finish(bytes);
                } else if tap.truncate {
                    tap.finish(bytes.slice(..tap.cap));
                } else {
                    tap.give_up(TapLoss::TooLarge);
                }
                RequestBody::Full(data)
            }
            RequestBody::Tee(mut tee) => {
                if tee.seen == 0 {
                    tee.taps.push(tap);
                } else {
                    // NB: taps are all set before the body streams; never reached.
                    tap.give_up(TapLoss::Incomplete);
                }
                RequestBody::Tee(tee)
            }
        }
    }
}

/// The client's body with bounded copies.
#[derive(Debug)]
pub struct Tee {
    inner: Incoming,
    /// The first bytes, as many as the largest cap of the taps still waiting.
    copy: BytesMut,
    /// Bytes that streamed past.
    seen: usize,
    taps: Vec<BodyTap>,
}

impl Tee {
    fn data(&mut self, data: &[u8]) {
        self.seen = self.seen.saturating_add(data.len());
        let seen = self.seen;
        self.taps.retain(|tap| {
            let keep = tap.truncate || seen <= tap.cap;
            if !keep {
                tap.give_up(TapLoss::TooLarge);
            }
            keep
        });
        let limit = self.taps.iter().map(|t| t.cap).max().unwrap_or(0);
        let room = limit.saturating_sub(self.copy.len());
        self.copy.extend_from_slice(&data[..data.len().min(room)]);
        if self.copy.len() > limit {
            self.copy.truncate(limit);
        }
    }

    fn end(&mut self) {
        let copy = std::mem::take(&mut self.copy).freeze();
        for tap in self.taps.drain(..) {
            tap.finish(copy.slice(..copy.len().min(tap.cap)));
        }
    }

    fn fail(&mut self) {
        self.copy = BytesMut::new();
        for tap in self.taps.drain(..) {
            tap.give_up(TapLoss::Incomplete);
        }
    }
}

impl Drop for Tee {
    fn drop(&mut self) {
        // The body did not end (the client went away, the upstream failed mid-body).
        self.fail();
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
                        if let Some(data) = frame.data_ref()
                            && !tee.taps.is_empty()
                        {
                            tee.data(data);
                        }
                    }
                    Poll::Ready(None) => tee.end(),
                    Poll::Ready(Some(Err(_))) => tee.fail(),
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

/// The taps the request phases asked for ([`BodyTap::attach`]), in the request's
/// extensions.
#[derive(Debug, Clone, Default)]
pub struct BodyTaps(pub Vec<BodyTap>);

/// What a tap's owner receives: the whole body, or why there is none.
pub type TapResult = Result<Bytes, TapLoss>;

/// A plugin's wish for a copy of the request body of at most `cap` bytes, put in the
/// request's extensions by a request phase (proxy-mirror). The request path wraps the body
/// with it; the copy (or why there is none) goes to the tap's receiver once the body has
/// been read to its end by the upstream exchange, never earlier, so that the client's body
/// streams upstream without waiting for the copy.
///
/// Several taps may share one body (a mirror and a logger): it is copied once, up to the
/// largest cap.
#[derive(Debug, Clone)]
pub struct BodyTap {
    cap: usize,
    /// The first `cap` bytes of any body (a logger), instead of none of a larger one.
    truncate: bool,
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
                truncate: false,
                tx: Arc::new(Mutex::new(Some(tx))),
            },
            rx,
        )
    }

    /// A tap of the first `cap` bytes of the body, whatever its length (a logger's
    /// `include_req_body` with `max_req_body_bytes`), and the receiver of its result.
    pub fn truncating(cap: usize) -> (Self, tokio::sync::oneshot::Receiver<TapResult>) {
        let (mut tap, rx) = BodyTap::new(cap);
        tap.truncate = true;
        (tap, rx)
    }

    /// Asks the request path for this copy of the request body of `req`: taps are kept
    /// in its extensions until the body goes upstream.
    pub fn attach(self, req: &mut http::Extensions) {
        match req.get_mut::<BodyTaps>() {
            Some(taps) => taps.0.push(self),
            None => {
                req.insert(BodyTaps(vec![self]));
            }
        }
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

        // A truncating tap (a logger) gets the first bytes instead, beside a whole one.
        let (cut, cut_rx) = BodyTap::truncating(4);
        let (whole, whole_rx) = BodyTap::new(5);
        let _ = RequestBody::Full(Some(Bytes::from_static(b"hello")))
            .tap(cut)
            .tap(whole);
        assert_eq!(cut_rx.await.unwrap(), Ok(Bytes::from_static(b"hell")));
        assert_eq!(whole_rx.await.unwrap(), Ok(Bytes::from_static(b"hello")));
    }
}
