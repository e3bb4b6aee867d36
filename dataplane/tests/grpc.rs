//! gRPC through the dataplane: a real tonic service behind an upstream of scheme `grpc`
//! (HTTP/2 with prior knowledge), a real tonic client talking h2c to the dataplane.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use sluice_proto::v1;
use sluice_testkit::grpc::{EchoClient, EchoRequest, GrpcEchoServer};
use tonic::Code;
use tonic::transport::Channel;

fn grpc_upstream(id: &str, backend: SocketAddr) -> v1::Upstream {
    v1::Upstream {
        scheme: v1::Scheme::Grpc as i32,
        ..upstream(id, &[(backend, 1)])
    }
}

async fn grpc_dataplane(backend: SocketAddr) -> (Dataplane, EchoClient<Channel>) {
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route("default/grpc/r1", &["/sluice.test.v1.Echo/*"], "g")],
                vec![grpc_upstream("g", backend)],
            ),
            vec![],
        )
        .unwrap();
    let channel = Channel::from_shared(format!("http://{}", dp.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (dp, EchoClient::new(channel))
}

fn req(message: &str) -> EchoRequest {
    EchoRequest {
        message: message.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn unary_call_with_metadata_both_ways() {
    let backend = GrpcEchoServer::start("g1", any()).await.unwrap();
    let (_dp, mut client) = grpc_dataplane(backend.addr).await;
    let mut request = tonic::Request::new(req("hello"));
    request
        .metadata_mut()
        .insert("x-test", "abc".parse().unwrap());
    let resp = client.unary(request).await.unwrap();
    assert_eq!(resp.metadata().get("x-echo-server").unwrap(), "g1");
    assert_eq!(resp.metadata().get("x-test-echo").unwrap(), "abc");
    assert_eq!(resp.into_inner().message, "hello");
}

#[tokio::test]
async fn non_ok_status_message_and_metadata_are_preserved() {
    let backend = GrpcEchoServer::start("g1", any()).await.unwrap();
    let (_dp, mut client) = grpc_dataplane(backend.addr).await;
    let status = client
        .unary(EchoRequest {
            message: "nope".into(),
            fail_code: Code::NotFound as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "failed: nope");
    assert_eq!(status.metadata().get("x-fail-detail").unwrap(), "nope");
}

#[tokio::test]
async fn server_streaming_ends_with_the_status_in_trailers() {
    let backend = GrpcEchoServer::start("g1", any()).await.unwrap();
    let (_dp, mut client) = grpc_dataplane(backend.addr).await;
    let mut stream = client
        .server_stream(EchoRequest {
            message: "m".into(),
            count: 5,
            fail_code: Code::Aborted as i32,
        })
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    let status = loop {
        match stream.next().await {
            Some(Ok(reply)) => got.push(reply.message),
            Some(Err(status)) => break status,
            None => panic!("stream ended without the trailing status"),
        }
    };
    assert_eq!(got, ["m-0", "m-1", "m-2", "m-3", "m-4"]);
    assert_eq!(status.code(), Code::Aborted);
    assert_eq!(status.message(), "failed: m");
    assert_eq!(status.metadata().get("x-fail-detail").unwrap(), "m");

    // A clean end: grpc-status 0 in the trailers.
    let stream = client
        .server_stream(EchoRequest {
            message: "ok".into(),
            count: 3,
            fail_code: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let all: Vec<_> = stream.collect().await;
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(Result::is_ok));
}

#[tokio::test]
async fn client_streaming_call() {
    let backend = GrpcEchoServer::start("g1", any()).await.unwrap();
    let (_dp, mut client) = grpc_dataplane(backend.addr).await;
    let outbound = futures::stream::iter(["a", "b", "c"].map(req));
    let reply = client.client_stream(outbound).await.unwrap().into_inner();
    assert_eq!(reply.message, "a,b,c");
    assert_eq!(reply.index, 3);
}

/// A bidirectional stream answers each message before the next is sent (so nothing is
/// buffered until the end), and it survives three snapshot swaps, one of which drops the
/// route and one that moves it to another upstream.
#[tokio::test]
async fn bidi_stream_is_interactive_and_survives_snapshot_swaps() {
    let backend = GrpcEchoServer::start("g1", any()).await.unwrap();
    let other = GrpcEchoServer::start("g2", any()).await.unwrap();
    let (dp, mut client) = grpc_dataplane(backend.addr).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<EchoRequest>(1);
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = client.bidi(outbound).await.unwrap().into_inner();
    let swaps = [
        snapshot(
            2,
            vec![route("default/grpc/r1", &["/sluice.test.v1.Echo/*"], "g2")],
            vec![grpc_upstream("g2", other.addr)],
        ),
        snapshot(3, vec![], vec![]),
        snapshot(
            4,
            vec![route("default/grpc/r1", &["/sluice.test.v1.Echo/*"], "g")],
            vec![grpc_upstream("g", backend.addr)],
        ),
    ];
    for (i, swap) in std::iter::once(None)
        .chain(swaps.into_iter().map(Some))
        .enumerate()
    {
        if let Some(s) = swap {
            dp.store.apply(s, vec![]).unwrap();
        }
        let msg = format!("ping-{i}");
        tx.send(req(&msg)).await.unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(10), inbound.next())
            .await
            .expect("reply in time")
            .unwrap()
            .unwrap();
        assert_eq!(reply.message, msg);
        assert_eq!(reply.index, i as u32);
    }
    drop(tx);
    assert!(inbound.next().await.is_none(), "clean end (grpc-status 0)");
    // New calls follow the last snapshot.
    assert!(client.unary(req("after")).await.is_ok());
}

#[tokio::test]
async fn many_concurrent_calls_on_one_client_connection() {
    let backend = GrpcEchoServer::start("g1", any()).await.unwrap();
    let (_dp, client) = grpc_dataplane(backend.addr).await;
    let calls = (0..50).map(|i| {
        let mut c = client.clone();
        async move { c.unary(req(&format!("m{i}"))).await }
    });
    let results = futures::future::join_all(calls).await;
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(r.unwrap().into_inner().message, format!("m{i}"));
    }
}

#[tokio::test]
async fn unreachable_grpc_upstream_is_a_gateway_error() {
    let dead = closed_port();
    let (_dp, mut client) = grpc_dataplane(dead).await;
    let status = client.unary(req("x")).await.unwrap_err();
    // A trailers-only gRPC answer, not a JSON body the client cannot read.
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "502 Bad Gateway");
}

#[tokio::test]
async fn no_route_is_unimplemented_for_grpc_clients() {
    let backend = GrpcEchoServer::start("g1", any()).await.unwrap();
    let (dp, mut client) = grpc_dataplane(backend.addr).await;
    dp.store.apply(snapshot(2, vec![], vec![]), vec![]).unwrap();
    let status = client.unary(req("x")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert_eq!(status.message(), "404 Route Not Found");
}
