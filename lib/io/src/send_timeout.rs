//! A bound on how long a write to a client may wait (nginx `send_timeout`): a client that
//! stops reading a response leaves the connection's writes pending; past the timeout they
//! fail and the connection closes, instead of holding its memory and its slot for ever.
//!
//! Only a write that cannot proceed arms the timer (the worker's [`CoarseTimer`]); a write
//! that goes through disarms it, so the bound is on each stall, not on the whole response.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::timer::{CoarseSleep, CoarseTimer};

/// `io` whose writes fail with `TimedOut` once they have waited `timeout`.
#[derive(Debug)]
pub struct SendTimeout<T> {
    io: T,
    timer: CoarseTimer,
    timeout: Duration,
    /// Armed while a write waits.
    sleep: Option<CoarseSleep>,
}

impl<T> SendTimeout<T> {
    /// Wraps `io`.
    pub fn new(io: T, timer: CoarseTimer, timeout: Duration) -> Self {
        SendTimeout {
            io,
            timer,
            timeout,
            sleep: None,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The wrapped stream alone.
    pub fn into_inner(self) -> T {
        self.io
    }

    /// The wrapped stream, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// Whether a write is waiting (its stall timer armed).
    pub fn is_stalled(&self) -> bool {
        self.sleep.is_some()
    }

    /// `poll` of the wrapped stream, with the stall bound applied.
    pub fn poll_bounded<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut T, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        let polled = poll(&mut self.io, cx);
        self.bounded(cx, polled)
    }

    /// `polled` from the wrapped stream, with the stall bound applied.
    #[inline]
    fn bounded<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.sleep = None;
            return polled;
        }
        let (timer, timeout) = (&self.timer, self.timeout);
        let sleep = self.sleep.get_or_insert_with(|| timer.sleep(timeout));
        if Pin::new(sleep).poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing within the send timeout",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.bounded(cx, polled)
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.bounded(cx, polled)
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.bounded(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.bounded(cx, polled)
    }
}
