//! A real gRPC backend (tonic) for proxy tests and benchmarks: the `sluice.test.v1.Echo`
//! service of `proto/echo.proto`, with unary, server-streaming, client-streaming and
//! bidirectional calls and a way to ask for a non-OK status.

use std::net::SocketAddr;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Response, Status, Streaming};

/// Generated messages, client and server of `sluice.test.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("sluice.test.v1");
}

pub use pb::echo_client::EchoClient;
pub use pb::{EchoReply, EchoRequest};

/// The service implementation. Every response carries the metadata `x-echo-server` (the
/// name given at start) and echoes the request metadata `x-test` as `x-test-echo`.
#[derive(Debug, Clone)]
pub struct EchoService {
    name: String,
}

fn failure(code: i32, message: &str) -> Status {
    let mut status = Status::new(Code::from_i32(code), format!("failed: {message}"));
    if let Ok(v) = MetadataValue::try_from(message) {
        status.metadata_mut().insert("x-fail-detail", v);
    }
    status
}

impl EchoService {
    fn respond<T>(&self, req_meta: &tonic::metadata::MetadataMap, body: T) -> Response<T> {
        let mut resp = Response::new(body);
        if let Ok(v) = MetadataValue::try_from(self.name.as_str()) {
            resp.metadata_mut().insert("x-echo-server", v);
        }
        if let Some(v) = req_meta.get("x-test") {
            resp.metadata_mut().insert("x-test-echo", v.clone());
        }
        resp
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<EchoReply, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::echo_server::Echo for EchoService {
    async fn unary(&self, req: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let meta = req.metadata().clone();
        let r = req.into_inner();
        if r.fail_code != 0 {
            return Err(failure(r.fail_code, &r.message));
        }
        Ok(self.respond(
            &meta,
            EchoReply {
                message: r.message,
                index: 0,
            },
        ))
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(
        &self,
        req: Request<EchoRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let meta = req.metadata().clone();
        let r = req.into_inner();
        let replies = (0..r.count).map({
            let message = r.message.clone();
            move |i| {
                Ok(EchoReply {
                    message: format!("{message}-{i}"),
                    index: i,
                })
            }
        });
        let tail = (r.fail_code != 0).then(|| Err(failure(r.fail_code, &r.message)));
        let stream = futures::stream::iter(replies.chain(tail));
        Ok(self.respond(&meta, Box::pin(stream) as ReplyStream))
    }

    async fn client_stream(
        &self,
        req: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<EchoReply>, Status> {
        let meta = req.metadata().clone();
        let mut stream = req.into_inner();
        let mut seen = Vec::new();
        while let Some(r) = stream.next().await {
            seen.push(r?.message);
        }
        Ok(self.respond(
            &meta,
            EchoReply {
                index: seen.len() as u32,
                message: seen.join(","),
            },
        ))
    }

    type BidiStream = ReplyStream;

    async fn bidi(
        &self,
        req: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let meta = req.metadata().clone();
        let stream = req.into_inner().enumerate().map(|(i, r)| {
            r.map(|r| EchoReply {
                message: r.message,
                index: i as u32,
            })
        });
        Ok(self.respond(&meta, Box::pin(stream) as ReplyStream))
    }
}

/// A running gRPC echo backend (h2c).
#[derive(Debug)]
pub struct GrpcEchoServer {
    /// Address it listens on.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcEchoServer {
    /// Starts the service named `name` on `addr` (port 0 for any free port).
    pub async fn start(name: &str, addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let svc = pb::echo_server::EchoServer::new(EchoService {
            name: name.to_owned(),
        });
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await
            {
                eprintln!("grpc echo server failed: {e}");
            }
        });
        Ok(GrpcEchoServer { addr, task })
    }

    /// The service, for callers that serve it themselves (e.g. over TLS).
    pub fn service(name: &str) -> pb::echo_server::EchoServer<EchoService> {
        pb::echo_server::EchoServer::new(EchoService {
            name: name.to_owned(),
        })
    }
}

impl Drop for GrpcEchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
