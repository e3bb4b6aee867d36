//! HTTP/2 to a plain-text upstream (scheme `grpc`: h2c with prior knowledge) against a real
//! hyper HTTP/2 server that counts its connections: requests of a worker share one
//! multiplexed connection, and a connection the upstream closed is replaced.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_proto::v1;
use tokio::net::TcpListener;

/// A hyper h2c origin answering `h2 <path>` (after `/slow` paths wait 200 ms; `/stream`
/// answers `start` at once and `end` a second later); counts accepted connections and
/// requests, and can drop every connection.
struct Origin {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    listener: tokio::task::JoinHandle<()>,
}

impl Origin {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (a, r, c) = (
            Arc::clone(&accepted),
            Arc::clone(&requests),
            Arc::clone(&conns),
        );
        let listener = tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                let r = Arc::clone(&r);
                let task = tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        r.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if req.uri().path().starts_with("/slow") {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            if req.uri().path() == "/stream" {
                                let frames = futures::stream::unfold(0, |i| async move {
                                    let data = match i {
                                        0 => "start",
                                        1 => {
                                            tokio::time::sleep(Duration::from_secs(1)).await;
                                            "end"
                                        }
                                        _ => return None,
                                    };
                                    Some((
                                        Ok::<_, Infallible>(Frame::data(Bytes::from(data))),
                                        i + 1,
                                    ))
                                });
                                return Ok::<_, Infallible>(http::Response::new(
                                    StreamBody::new(frames).boxed(),
                                ));
                            }
                            let body = format!("{:?} {}", req.version(), req.uri().path());
                            Ok(http::Response::new(Full::new(Bytes::from(body)).boxed()))
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
                c.lock().unwrap().push(task);
            }
        });
        Origin {
            addr,
            accepted,
            requests,
            conns,
            listener,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Closes the listener and every connection, as a dying pod does.
    fn kill(&self) {
        self.listener.abort();
        self.drop_connections();
    }

    fn drop_connections(&self) {
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

async fn h2_dataplane(origin: SocketAddr) -> Dataplane {
    let dp = dataplane().await;
    let mut up = upstream("u", &[(origin, 1)]);
    up.scheme = v1::Scheme::Grpc as i32;
    dp.store
        .apply(
            snapshot(1, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap();
    dp
}

#[tokio::test]
async fn concurrent_requests_share_one_multiplexed_connection() {
    let origin = Origin::start().await;
    let dp = h2_dataplane(origin.addr).await;
    let addr = dp.addr;
    let requests =
        (0..20).map(|i| async move { get(addr, "h2.test", &format!("/slow/{i}")).await });
    let responses = futures::future::join_all(requests).await;
    for (i, r) in responses.iter().enumerate() {
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), format!("HTTP/2.0 /slow/{i}"));
    }
    // 20 requests in flight together, from 20 client connections: one upstream connection.
    assert_eq!(origin.accepted(), 1);
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_replaced() {
    let origin = Origin::start().await;
    let dp = h2_dataplane(origin.addr).await;
    assert_eq!(
        get(dp.addr, "h2.test", "/one").await.text(),
        "HTTP/2.0 /one"
    );
    origin.drop_connections();
    // Let the close reach the dataplane's side of the connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = get(dp.addr, "h2.test", "/two").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.text(), "HTTP/2.0 /two");
    assert_eq!(origin.accepted(), 2);
}

#[tokio::test]
async fn request_body_streams_to_an_h2_upstream() {
    // An origin that echoes the body length.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(format!(
                        "got {}",
                        body.len()
                    )))))
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let dp = h2_dataplane(origin).await;
    let req = http::Request::post("/upload")
        .header("host", "h2.test")
        .body(Full::new(Bytes::from(vec![b'x'; 300_000])))
        .unwrap();
    let resp = send(dp.addr, req).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "got 300000");
}

#[tokio::test]
async fn a_dead_endpoint_is_retried_on_another_and_ejected_by_the_passive_check() {
    let origin = Origin::start().await;
    let dead = closed_port();
    let dp = dataplane().await;
    let mut up = upstream("u", &[(dead, 1), (origin.addr, 1)]);
    up.scheme = v1::Scheme::Grpc as i32;
    up.health_check = Some(passive_check());
    dp.store
        .apply(
            snapshot(1, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap();
    // Round robin sends the first request to the dead endpoint: its connect failure is
    // retried on the live one.
    for i in 0..6 {
        let r = get(dp.addr, "h2.test", &format!("/r/{i}")).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.text(), format!("HTTP/2.0 /r/{i}"));
    }
    assert_eq!(
        health_of(&dp, "u", dead),
        Some(0.0),
        "dead endpoint ejected"
    );
    assert_eq!(health_of(&dp, "u", origin.addr), Some(1.0));
    assert_eq!(
        metric_of(&dp, "sluice_upstream_retries_total", &["upstream=\"u\""]),
        Some(1.0),
        "one retry: the ejected endpoint is not tried again"
    );
}

#[tokio::test]
async fn an_endpoint_killed_under_traffic_costs_no_request() {
    let a = Origin::start().await;
    let b = Origin::start().await;
    let dp = dataplane().await;
    let mut up = upstream("u", &[(a.addr, 1), (b.addr, 1)]);
    up.scheme = v1::Scheme::Grpc as i32;
    up.health_check = Some(passive_check());
    dp.store
        .apply(
            snapshot(1, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap();
    // Both endpoints hold a shared HTTP/2 connection.
    for i in 0..4 {
        assert_eq!(
            get(dp.addr, "h2.test", &format!("/warm/{i}")).await.status,
            200
        );
    }
    assert_eq!((a.accepted(), b.accepted()), (1, 1));
    a.kill();
    // Requests that meet the dead connection or the closed port go to `b`.
    for i in 0..10 {
        let r = get(dp.addr, "h2.test", &format!("/after/{i}")).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.text(), format!("HTTP/2.0 /after/{i}"));
    }
    assert_eq!(
        health_of(&dp, "u", a.addr),
        Some(0.0),
        "killed endpoint ejected"
    );
}

#[tokio::test]
async fn least_conn_counts_a_streamed_response_until_its_end() {
    // An HTTP/2 response is in flight until its body ends, not when its head arrives (APISIX
    // counts a request until nginx has sent the whole response).
    let (a, b) = (Origin::start().await, Origin::start().await);
    let dp = dataplane().await;
    let mut up = upstream("u", &[(a.addr, 1), (b.addr, 1)]);
    up.scheme = v1::Scheme::Grpc as i32;
    up.load_balancer = v1::LoadBalancer::LeastConn as i32;
    dp.store
        .apply(
            snapshot(1, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap();
    let addr = dp.addr;
    let long = tokio::spawn(async move { get(addr, "h2.test", "/stream").await });
    assert!(
        eventually(Duration::from_secs(1), || a.requests() + b.requests() == 1).await,
        "the streamed request reached an origin"
    );
    // Its head (and first frame) arrived long ago; its body is still streaming.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (busy, idle) = if a.requests() == 1 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let in_flight = |o: &Origin| {
        metric_of(
            &dp,
            "sluice_upstream_requests_in_flight",
            &["upstream=\"u\"", &format!("endpoint=\"{}\"", o.addr)],
        )
    };
    assert_eq!(in_flight(busy), Some(1.0));
    for i in 0..6 {
        let r = get(dp.addr, "h2.test", &format!("/x/{i}")).await;
        assert_eq!(r.text(), format!("HTTP/2.0 /x/{i}"));
    }
    assert_eq!(
        busy.requests(),
        1,
        "least_conn sent a request to the busy endpoint"
    );
    assert_eq!(idle.requests(), 6);
    let long = long.await.unwrap();
    assert_eq!(long.text(), "startend");
    assert_eq!(in_flight(busy), Some(0.0));
    assert_eq!(in_flight(idle), Some(0.0));
}

#[tokio::test]
async fn prometheus_names_the_h2_node_and_times_the_upstream() {
    // The `node` label and the upstream latency come from the endpoint that answered, on
    // the HTTP/2 path as on HTTP/1.1 (APISIX dashboards group by node).
    let origin = Origin::start().await;
    let dp = dataplane().await;
    let mut up = upstream("u", &[(origin.addr, 1)]);
    up.scheme = v1::Scheme::Grpc as i32;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with(
                    "default/r/r1",
                    &["/*"],
                    "u",
                    vec![plugin("prometheus", serde_json::json!({}))],
                )],
                vec![up],
            ),
            vec![],
        )
        .unwrap();
    let r = get(dp.addr, "h2.test", "/slow/1").await;
    assert_eq!(r.text(), "HTTP/2.0 /slow/1");
    let text = dp.store.render_metrics();
    let node = origin.addr.ip().to_string();
    let status = format!(
        "apisix_http_status{{code=\"200\",route=\"default/r/r1\",matched_uri=\"/*\",matched_host=\"\",service=\"\",consumer=\"\",node=\"{node}\"}}"
    );
    assert_eq!(sample(&text, &status), Some(1.0), "{text}");
    let upstream_ms = format!(
        "apisix_http_latency_sum{{type=\"upstream\",route=\"default/r/r1\",service=\"\",consumer=\"\",node=\"{node}\"}}"
    );
    let ms = sample(&text, &upstream_ms).unwrap_or(0.0);
    assert!(ms >= 200.0, "the origin waited 200 ms, logged {ms}: {text}");
}
