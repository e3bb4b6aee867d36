//! The HTTP/2 client of upstreams (`h2` over TLS, h2c, gRPC): hyper's, whose connection
//! runs in a task of its own and multiplexes the requests of one worker. Bodies stream
//! both ways frame by frame, trailers included, so gRPC streaming, `grpc-status` and
//! `grpc-message` pass through untouched; `te: trailers` is kept. Which connection a
//! request takes, and its retries, are [`crate::upstream::protocol`]'s and
//! [`crate::upstream::attempt`]'s.

use http::header::{self, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::client::conn::http2;
use hyper_util::rt::TokioExecutor;

use crate::http::ConnInfo;
use crate::http::headers::strip_hop_by_hop;
use crate::upstream::Timeouts;
use crate::upstream::body::{ProxyBody, StreamBody};
use crate::upstream::error::ProxyError;
use crate::upstream::health::InFlight;
use crate::upstream::protocol::Prepared;
use crate::upstream::request_body::RequestBody;
use sluice_io::h1::H1Error;
use sluice_io::timer::CoarseTimer;

/// Sets up an HTTP/2 client connection on `io` (its task spawned); `timer` drives its
/// keep-alive and timeouts.
pub(crate) async fn handshake<T>(
    io: T,
    timer: &CoarseTimer,
) -> Result<http2::SendRequest<RequestBody>, hyper::Error>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (tx, c) = http2::Builder::new(TokioExecutor::new())
        .timer(timer.clone())
        .handshake(io)
        .await?;
    tokio::spawn(async move {
        if let Err(e) = c.await {
            tracing::debug!(error = %e, "upstream h2 connection ended");
        }
    });
    Ok(tx)
}

/// Why [`send`] failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The request never left: its connection died before taking it and no new one could
    /// be made. Another endpoint may take it.
    Unsent(Box<Prepared>, ProxyError),
    /// The request may have reached the upstream.
    Failed(ProxyError),
}

impl From<ProxyError> for SendError {
    fn from(e: ProxyError) -> Self {
        SendError::Failed(e)
    }
}

/// Sends `prepared` on `tx`, an HTTP/2 connection to the endpoint `address` (`tls`: over
/// TLS, scheme `https`); `host` is the `:authority` this endpoint receives. The response's
/// body keeps `in_flight` (taken from it) until it ends.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn send(
    prepared: Prepared,
    host: Option<&HeaderValue>,
    conn: &ConnInfo,
    tls: bool,
    address: &str,
    mut tx: http2::SendRequest<RequestBody>,
    timeouts: Timeouts,
    in_flight: &mut Option<InFlight>,
) -> Result<Response<ProxyBody>, SendError> {
    let Prepared { parts, body, path } = prepared;
    let mut req = Request::from_parts(parts, body);
    let scheme = if tls { "https" } else { "http" };
    let authority = host
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or(address);
    *req.uri_mut() = Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path.as_str())
        .build()
        .map_err(|_| SendError::Failed(ProxyError::BadRequest("invalid host or path")))?;
    *req.version_mut() = Version::HTTP_2;
    req.headers_mut().remove(header::HOST);
    let sent = conn
        .timer
        .timeout(timeouts.read, tx.try_send_request(req))
        .await;
    let response = match sent {
        Err(_) => return Err(ProxyError::ReadTimeout(address.to_owned()).into()),
        Ok(Ok(resp)) => resp,
        Ok(Err(mut e)) => {
            let failed = |e: hyper::Error| ProxyError::Upstream {
                addr: address.to_owned(),
                source: H1Error::Io(std::io::Error::other(e)),
            };
            return Err(match e.take_message() {
                // NB: the request never left (the connection had just died).
                Some(again) => {
                    SendError::Unsent(Box::new(unsent(again, path)), failed(e.into_error()))
                }
                None => SendError::Failed(failed(e.into_error())),
            });
        }
    };
    let (mut parts, body) = response.into_parts();
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    let Some(in_flight) = in_flight.take() else {
        return Err(ProxyError::NoEndpoint(address.to_owned()).into());
    };
    Ok(Response::from_parts(
        parts,
        ProxyBody::Stream(StreamBody::new(body, in_flight)),
    ))
}

/// A request an HTTP/2 connection handed back untaken, made ready for another endpoint
/// again (its target back to the path alone).
fn unsent(req: Request<RequestBody>, path: String) -> Prepared {
    let (mut parts, body) = req.into_parts();
    if let Ok(uri) = Uri::try_from(path.as_str()) {
        parts.uri = uri;
    }
    Prepared { parts, body, path }
}
