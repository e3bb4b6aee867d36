//! The one place where request-path errors become HTTP responses: a short JSON body sent
//! as `text/plain; charset=utf-8`, as APISIX sends its own (nginx's `default_type`)
//! (APISIX's `error_msg` shape) that never carries internal addresses, or a trailers-only
//! answer for a gRPC client.

use bytes::Bytes;
use http::{HeaderValue, Response, header};

use crate::upstream::body::ProxyBody;
use crate::upstream::error::ProxyError;

impl ProxyError {
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
            ProxyError::UpstreamTls { .. } => {
                "{\"error_msg\":\"502 Bad Gateway: TLS handshake with the upstream failed\"}\n"
            }
            ProxyError::ConnectTimeout(_)
            | ProxyError::ReadTimeout(_)
            | ProxyError::SendTimeout(_)
            | ProxyError::RequestTimeout(_)
            | ProxyError::AttemptTimeout(_) => "{\"error_msg\":\"504 Gateway Timeout\"}\n",
            ProxyError::BadRequest(_) | ProxyError::RequestBody(_) => {
                "{\"error_msg\":\"400 Bad Request\"}\n"
            }
            ProxyError::ClientBodyTimeout => "{\"error_msg\":\"408 Request Timeout\"}\n",
            ProxyError::HeadTooLarge(_) => {
                "{\"error_msg\":\"431 Request Header Fields Too Large\"}\n"
            }
            ProxyError::BodyTooLarge(_) => "{\"error_msg\":\"413 Request Entity Too Large\"}\n",
        }
    }

    /// Maps the error to the response sent to a gRPC client (`content-type:
    /// application/grpc...`): a trailers-only response, HTTP 200 with `grpc-status` and
    /// `grpc-message`, as gRPC clients cannot read the JSON body of other errors.
    pub fn into_grpc_response(self) -> Response<ProxyBody> {
        let mut resp = Response::new(ProxyBody::empty());
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(
            "grpc-status",
            HeaderValue::from(u16::from(self.grpc_status())),
        );
        let message = self.body();
        let message = message
            .trim_end()
            .trim_start_matches("{\"error_msg\":\"")
            .trim_end_matches("\"}");
        if let Ok(v) = HeaderValue::from_str(message) {
            h.insert("grpc-message", v);
        }
        resp
    }

    /// Maps the error to the response sent downstream. This is the only place that does so.
    pub fn into_response(self) -> Response<ProxyBody> {
        let mut resp = Response::new(ProxyBody::full(Bytes::from_static(self.body().as_bytes())));
        *resp.status_mut() = self.status();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }
}
