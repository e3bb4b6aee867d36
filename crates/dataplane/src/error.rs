//! Request-path errors and the one place where they become HTTP responses.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::body::ProxyBody;

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
    /// The upstream connection failed while sending the request or reading the response head.
    #[error("upstream {addr} failed: {source}")]
    Upstream {
        /// Endpoint address.
        addr: String,
        /// What went wrong.
        source: crate::h1::H1Error,
    },
    /// The downstream request body failed while it was being sent upstream.
    #[error("reading the request body failed: {0}")]
    RequestBody(hyper::Error),
    /// The request cannot be turned into an upstream request.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
}

impl ProxyError {
    /// Who is at fault.
    pub fn source_kind(&self) -> ErrorSource {
        match self {
            ProxyError::NoRoute | ProxyError::BadRequest(_) | ProxyError::RequestBody(_) => {
                ErrorSource::Downstream
            }
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
            ProxyError::Connect { .. } | ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::ConnectTimeout(_)
            | ProxyError::ReadTimeout(_)
            | ProxyError::SendTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::BadRequest(_) | ProxyError::RequestBody(_) => StatusCode::BAD_REQUEST,
        }
    }

    /// The short JSON body a client sees. It never carries internal addresses.
    fn body(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "{\"error_msg\":\"404 Route Not Found\"}\n",
            ProxyError::NoEndpoint(_) => "{\"error_msg\":\"503 No Available Upstream Endpoint\"}\n",
            ProxyError::AllEndpointsDown(_) => {
                "{\"error_msg\":\"503 Service Unavailable: every upstream endpoint is down\"}\n"
            }
            ProxyError::Connect { .. } | ProxyError::Upstream { .. } => {
                "{\"error_msg\":\"502 Bad Gateway\"}\n"
            }
            ProxyError::ConnectTimeout(_)
            | ProxyError::ReadTimeout(_)
            | ProxyError::SendTimeout(_) => "{\"error_msg\":\"504 Gateway Timeout\"}\n",
            ProxyError::BadRequest(_) | ProxyError::RequestBody(_) => {
                "{\"error_msg\":\"400 Bad Request\"}\n"
            }
        }
    }

    /// Maps the error to the response sent downstream. This is the only place that does so.
    pub fn into_response(self) -> Response<ProxyBody> {
        let mut resp = Response::new(ProxyBody::full(Bytes::from_static(self.body().as_bytes())));
        *resp.status_mut() = self.status();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
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
