//! Everything that can stop a request from being proxied, with who is at fault, the status a
//! client sees and whether a retry is allowed. The one place where these errors become
//! HTTP responses is [`crate::request::error`].

use http::StatusCode;

use crate::upstream::health::Outcome;

/// Where a request-path error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// The client (downstream) sent something we cannot serve.
    Downstream,
    /// The upstream failed or timed out.
    Upstream,
    /// Sluice itself (configuration, internal state).
    Internal,
}

/// Everything that can stop a request from being proxied.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No route matches the request.
    #[error("no route matched")]
    NoRoute,
    /// The matched route's upstream has no endpoint to send to.
    #[error("upstream {0} has no available endpoint")]
    NoEndpoint(String),
    /// Every endpoint of the upstream was tried and none could be connected to.
    #[error("upstream {0}: every endpoint is down")]
    AllEndpointsDown(String),
    /// Connecting to the upstream endpoint failed.
    #[error("connect to {addr} failed: {source}")]
    Connect {
        /// Endpoint address.
        addr: String,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// Connecting to the upstream endpoint took longer than the connect timeout.
    #[error("connect to {0} timed out")]
    ConnectTimeout(String),
    /// Writing the request body upstream stalled longer than the send timeout.
    #[error("sending to upstream {0} timed out")]
    SendTimeout(String),
    /// The upstream did not answer within the read timeout.
    #[error("upstream {0} timed out")]
    ReadTimeout(String),
    /// The route's whole-request deadline (HTTPRoute `timeouts.request`) passed before a
    /// response head came: the attempt in flight was cancelled, its connection closed.
    #[error("request to upstream {0} exceeded the route's request timeout")]
    RequestTimeout(String),
    /// One attempt's deadline (HTTPRoute `timeouts.backendRequest`) passed before its
    /// response head came: the attempt was cancelled, its connection closed.
    #[error("upstream {0} did not answer within the attempt timeout")]
    AttemptTimeout(String),
    /// The TLS handshake with the upstream failed (e.g. its certificate did not verify).
    #[error("TLS to upstream {addr} failed: {source}")]
    UpstreamTls {
        /// Endpoint address.
        addr: String,
        /// Underlying error (rustls errors arrive wrapped in I/O errors).
        source: std::io::Error,
    },
    /// The upstream connection failed while sending the request or reading the response head.
    #[error("upstream {addr} failed: {source}")]
    Upstream {
        /// Endpoint address.
        addr: String,
        /// What went wrong.
        source: sluice_io::h1::H1Error,
    },
    /// The client paused its request body longer than the client body timeout.
    #[error("client request body timed out")]
    ClientBodyTimeout,
    /// The downstream request body failed while it was being sent upstream.
    #[error("reading the request body failed: {0}")]
    RequestBody(hyper::Error),
    /// The request head is larger than the downstream limit.
    #[error("request head of {0} bytes is over the limit")]
    HeadTooLarge(usize),
    /// The request body grew past the route's limit ([`crate::upstream::body::BodyLimit`],
    /// client-control's `max_body_size`) while it streamed upstream; the upstream request
    /// was cut short and its connection closed.
    #[error("request body is over the limit of {0} bytes")]
    BodyTooLarge(u64),
    /// The request cannot be turned into an upstream request.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
}

impl ProxyError {
    /// Who is at fault.
    pub fn source_kind(&self) -> ErrorSource {
        match self {
            ProxyError::NoRoute
            | ProxyError::BadRequest(_)
            | ProxyError::RequestBody(_)
            | ProxyError::HeadTooLarge(_)
            | ProxyError::BodyTooLarge(_)
            | ProxyError::ClientBodyTimeout => ErrorSource::Downstream,
            ProxyError::NoEndpoint(_) => ErrorSource::Internal,
            ProxyError::AllEndpointsDown(_) => ErrorSource::Upstream,
            _ => ErrorSource::Upstream,
        }
    }

    /// Whether the same request could be retried on another endpoint without side effects
    /// upstream (nothing of the request reached the upstream application).
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            ProxyError::Connect { .. } | ProxyError::ConnectTimeout(_)
        )
    }

    /// The status code a client sees.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::NoEndpoint(_) | ProxyError::AllEndpointsDown(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::Connect { .. }
            | ProxyError::Upstream { .. }
            | ProxyError::UpstreamTls { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::ConnectTimeout(_)
            | ProxyError::ReadTimeout(_)
            | ProxyError::SendTimeout(_)
            | ProxyError::RequestTimeout(_)
            | ProxyError::AttemptTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::BadRequest(_) | ProxyError::RequestBody(_) => StatusCode::BAD_REQUEST,
            ProxyError::ClientBodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// What the error says about the endpoint's health, for the passive health check
    /// (`None`: not the endpoint's fault).
    pub fn health_outcome(&self) -> Option<Outcome> {
        match self {
            ProxyError::Connect { .. } | ProxyError::Upstream { .. } => Some(Outcome::TcpFailure),
            // NB: a failed handshake counts as a TCP failure, as in lua-resty-healthcheck.
            ProxyError::UpstreamTls { .. } => Some(Outcome::TcpFailure),
            ProxyError::ConnectTimeout(_)
            | ProxyError::ReadTimeout(_)
            | ProxyError::SendTimeout(_)
            | ProxyError::RequestTimeout(_)
            | ProxyError::AttemptTimeout(_) => Some(Outcome::Timeout),
            _ => None,
        }
    }

    /// The gRPC status code for a gRPC client (the HTTP-to-gRPC mapping of the gRPC spec:
    /// 404 UNIMPLEMENTED, 400 INTERNAL, 502/503/504 UNAVAILABLE).
    pub fn grpc_status(&self) -> u8 {
        match self.status() {
            StatusCode::NOT_FOUND => 12,
            StatusCode::BAD_REQUEST => 13,
            _ => 14,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(ProxyError::NoRoute.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            ProxyError::ReadTimeout("a".into()).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            ProxyError::NoEndpoint("u".into()).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let e = ProxyError::Connect {
            addr: "1.2.3.4:80".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(e.retryable());
        assert_eq!(e.status(), StatusCode::BAD_GATEWAY);
    }
}
