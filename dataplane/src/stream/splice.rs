//! Copies bytes both ways between a client and its upstream until both sides are done, the
//! connection stays idle too long, or its route is drained.
//!
//! - `tokio::io::copy_bidirectional_with_sizes` with 64 KiB each way: a side that reaches
//!   EOF gets the other side shut down for writing (half-close), the other direction goes
//!   on until its own EOF.
//! - The idle clock restarts on every byte read from either side; past `idle` with nothing,
//!   both sockets are closed.
//! - A write blocks while the reader on the other side does not read: memory stays at the
//!   two buffers.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Buffer size of each direction.
pub const BUFFER: usize = 64 * 1024;

/// How a splice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Both sides closed (or one failed).
    Done,
    /// Nothing moved for the idle timeout.
    Idle,
    /// The route was removed and the drain timeout passed.
    Drained,
}

/// Bytes moved by a splice.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Client to upstream.
    pub upstream: u64,
    /// Upstream to client.
    pub downstream: u64,
}

/// A stream that counts what is read from it and stamps the shared clock.
struct Counted<S> {
    inner: S,
    read: u64,
    clock: Arc<Clock>,
}

/// Milliseconds since the splice started at which something was last read.
struct Clock {
    started: tokio::time::Instant,
    last_ms: AtomicU64,
}

impl Clock {
    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> tokio::time::Instant {
        self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.read += n as u64;
            self.clock.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Copies between `client` and `upstream` until both are done, `idle` passes without a
/// byte, or `stop` resolves (the route's drain ended).
pub async fn splice<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> (Ended, Moved)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let clock = Arc::new(Clock {
        started: tokio::time::Instant::now(),
        last_ms: AtomicU64::new(0),
    });
    let mut c = Counted {
        inner: client,
        read: 0,
        clock: Arc::clone(&clock),
    };
    let mut u = Counted {
        inner: upstream,
        read: 0,
        clock: Arc::clone(&clock),
    };
    let ended = {
        let copy = tokio::io::copy_bidirectional_with_sizes(&mut c, &mut u, BUFFER, BUFFER);
        tokio::pin!(copy);
        let idle_clock = async {
            loop {
                let due = clock.last() + idle;
                tokio::time::sleep_until(due).await;
                if clock.last() + idle <= tokio::time::Instant::now() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = &mut copy => Ended::Done,
            () = idle_clock => Ended::Idle,
            () = stop => Ended::Drained,
        }
    };
    (
        ended,
        Moved {
            upstream: c.read,
            downstream: u.read,
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn idle_clock_restarts_on_traffic_and_closes_a_silent_pair() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(async move {
            splice(
                client,
                upstream,
                Duration::from_millis(500),
                std::future::pending(),
            )
            .await
        });
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            client_peer.write_all(b"ping").await.unwrap();
            let mut b = [0; 4];
            upstream_peer.read_exact(&mut b).await.unwrap();
        }
        let start = tokio::time::Instant::now();
        let (ended, moved) = task.await.unwrap();
        assert_eq!(ended, Ended::Idle);
        // Idle counts from the last byte (900 ms in), not from the start.
        assert!(
            start.elapsed() >= Duration::from_millis(400),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(moved.upstream, 12);
    }

    #[tokio::test]
    async fn half_close_still_delivers_the_response() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(async move {
            splice(
                client,
                upstream,
                Duration::from_secs(60),
                std::future::pending(),
            )
            .await
        });
        client_peer.write_all(b"request").await.unwrap();
        client_peer.shutdown().await.unwrap();
        let mut req = Vec::new();
        upstream_peer.read_to_end(&mut req).await.unwrap();
        assert_eq!(req, b"request");
        upstream_peer.write_all(b"response").await.unwrap();
        upstream_peer.shutdown().await.unwrap();
        let mut resp = Vec::new();
        client_peer.read_to_end(&mut resp).await.unwrap();
        assert_eq!(resp, b"response");
        let (ended, moved) = task.await.unwrap();
        assert_eq!(ended, Ended::Done);
        assert_eq!((moved.upstream, moved.downstream), (7, 8));
    }
}
