//! WebSocket through the dataplane: a real tokio-tungstenite server behind it and a real
//! tokio-tungstenite client in front of it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use sluice_proto::v1;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

#[allow(clippy::result_large_err)]
/// A WebSocket server that greets each session with `hello from <name> <path>`, then echoes
/// every text message as `<name>: <text>` and sends `tick` on its own when asked (`tick?`).
async fn ws_server(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut path = String::new();
                let callback = |req: &Request, resp: Response| {
                    path = req.uri().path().to_owned();
                    Ok(resp)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
                    return;
                };
                ws.send(Message::text(format!("hello from {name} {path}")))
                    .await
                    .unwrap();
                while let Some(Ok(msg)) = ws.next().await {
                    match msg {
                        Message::Text(t) if t.as_str() == "tick?" => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            ws.send(Message::text("tick")).await.unwrap();
                        }
                        Message::Text(t) => {
                            ws.send(Message::text(format!("{name}: {}", t.as_str())))
                                .await
                                .unwrap();
                        }
                        Message::Binary(b) => ws.send(Message::Binary(b)).await.unwrap(),
                        Message::Close(_) => break,
                        _ => {}
                    }
                }
            });
        }
    });
    addr
}

fn ws_route(websocket: bool, upstream: &str) -> v1::Route {
    v1::Route {
        websocket,
        ..route("default/ws/r1", &["/ws*"], upstream)
    }
}

async fn next_text<S>(ws: &mut S) -> String
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("message in time")
        .expect("stream open")
        .expect("no error");
    msg.into_text().unwrap().as_str().to_owned()
}

#[tokio::test]
async fn websocket_session_stays_open_across_three_snapshot_swaps() {
    let backend = ws_server("ws1").await;
    let other = ws_server("ws2").await;
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![ws_route(true, "u")],
                vec![upstream("u", &[(backend, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{}/ws/chat", dp.addr))
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    assert_eq!(next_text(&mut ws).await, "hello from ws1 /ws/chat");

    let swaps = [
        // The route moves to another upstream.
        snapshot(
            2,
            vec![ws_route(true, "v")],
            vec![upstream("v", &[(other, 1)])],
        ),
        // The route disappears.
        snapshot(3, vec![], vec![]),
        // The route comes back without websocket.
        snapshot(
            4,
            vec![ws_route(false, "u")],
            vec![upstream("u", &[(backend, 1)])],
        ),
    ];
    for (i, swap) in swaps.into_iter().enumerate() {
        dp.store.apply(swap, vec![]).unwrap();
        ws.send(Message::text(format!("msg {i}"))).await.unwrap();
        assert_eq!(next_text(&mut ws).await, format!("ws1: msg {i}"));
        // The server speaks on its own too.
        ws.send(Message::text("tick?")).await.unwrap();
        assert_eq!(next_text(&mut ws).await, "tick");
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(echoed.into_data().as_ref(), &[0u8, 1, 2, 255]);
    ws.close(None).await.unwrap();

    // A new session follows the current snapshot, whose route has websocket off.
    assert!(
        tokio_tungstenite::connect_async(format!("ws://{}/ws/chat", dp.addr))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_session_quiet_past_the_keepalive_parking_grace_stays_open() {
    // Idle HTTP/1.1 connections are parked after 250 ms without a request; an upgraded one
    // belongs to its session and must never be.
    let backend = ws_server("ws1").await;
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![ws_route(true, "u")],
                vec![upstream("u", &[(backend, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws/quiet", dp.addr))
        .await
        .unwrap();
    assert_eq!(next_text(&mut ws).await, "hello from ws1 /ws/quiet");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        metric_of(&dp, "sluice_dataplane_parked_connections", &[]),
        Some(0.0)
    );
    ws.send(Message::text("still there")).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "ws1: still there");
}

#[tokio::test]
async fn upgrade_headers_are_dropped_on_routes_without_websocket() {
    let backend = ws_server("ws1").await;
    let dp = dataplane_to("/ws*", backend).await;
    let err = tokio_tungstenite::connect_async(format!("ws://{}/ws", dp.addr))
        .await
        .unwrap_err();
    // The upstream saw a plain GET (no Upgrade header) and refused the handshake.
    match err {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            assert_ne!(resp.status(), 101);
        }
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn many_sessions_in_parallel_each_get_their_own_upstream_connection() {
    let backend = ws_server("ws1").await;
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![ws_route(true, "u")],
                vec![upstream("u", &[(backend, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let addr = dp.addr;
    let sessions = (0..20).map(|i| async move {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws/{i}"))
            .await
            .unwrap();
        assert_eq!(next_text(&mut ws).await, format!("hello from ws1 /ws/{i}"));
        ws.send(Message::text(format!("s{i}"))).await.unwrap();
        assert_eq!(next_text(&mut ws).await, format!("ws1: s{i}"));
    });
    futures::future::join_all(sessions).await;
}

#[tokio::test]
async fn an_upgrade_to_a_dead_endpoint_is_retried_on_another_and_ejects_it() {
    let backend = ws_server("alive").await;
    let dead = closed_port();
    let dp = dataplane().await;
    let mut up = upstream("u", &[(dead, 1), (backend, 1)]);
    up.health_check = Some(passive_check());
    dp.store
        .apply(snapshot(1, vec![ws_route(true, "u")], vec![up]), vec![])
        .unwrap();
    for i in 0..4 {
        let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{}/ws/{i}", dp.addr))
            .await
            .unwrap();
        assert_eq!(resp.status(), 101);
        assert_eq!(
            next_text(&mut ws).await,
            format!("hello from alive /ws/{i}")
        );
        ws.send(Message::text("hi")).await.unwrap();
        assert_eq!(next_text(&mut ws).await, "alive: hi");
        ws.close(None).await.unwrap();
    }
    assert_eq!(
        health_of(&dp, "u", dead),
        Some(0.0),
        "dead endpoint ejected"
    );
    assert_eq!(health_of(&dp, "u", backend), Some(1.0));
}

/// `sluice_upstream_requests_in_flight` of `endpoint` in upstream `u`.
fn in_flight_of(dp: &Dataplane, endpoint: SocketAddr) -> Option<f64> {
    metric_of(
        dp,
        "sluice_upstream_requests_in_flight",
        &["upstream=\"u\"", &format!("endpoint=\"{endpoint}\"")],
    )
}

#[tokio::test]
async fn least_conn_counts_an_open_session_until_it_ends() {
    // APISIX (nginx) counts a WebSocket session as one connection for its whole life, so
    // least_conn spreads long-lived sessions; a count that ended at the 101 would not.
    let (a, b) = (ws_server("a").await, ws_server("b").await);
    let dp = dataplane().await;
    let mut up = upstream("u", &[(a, 1), (b, 1)]);
    up.load_balancer = v1::LoadBalancer::LeastConn as i32;
    dp.store
        .apply(snapshot(1, vec![ws_route(true, "u")], vec![up]), vec![])
        .unwrap();
    let url = format!("ws://{}/ws/long", dp.addr);
    let (mut long, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let greeting = next_text(&mut long).await;
    let (busy, idle, other) = if greeting.starts_with("hello from a ") {
        (a, b, "b")
    } else {
        (b, a, "a")
    };
    assert_eq!(in_flight_of(&dp, busy), Some(1.0));
    assert_eq!(in_flight_of(&dp, idle), Some(0.0));

    // While it lasts, every short session goes to the other endpoint.
    for i in 0..4 {
        let (mut short, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws/{i}", dp.addr))
            .await
            .unwrap();
        assert_eq!(
            next_text(&mut short).await,
            format!("hello from {other} /ws/{i}")
        );
        close_and_settle(short, &dp, idle).await;
    }

    // The long session still works, and its end is counted.
    long.send(Message::text("still here")).await.unwrap();
    assert!(next_text(&mut long).await.ends_with(": still here"));
    close_and_settle(long, &dp, busy).await;
    assert_eq!(in_flight_of(&dp, idle), Some(0.0));
}

/// Closes `ws` from the client side and asserts that `endpoint`'s in-flight count
/// returns to 0 (the dataplane sees both sides of the session close).
async fn close_and_settle<S>(mut ws: S, dp: &Dataplane, endpoint: SocketAddr)
where
    S: futures::Sink<Message, Error = tokio_tungstenite::tungstenite::Error>
        + futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
        + Unpin,
{
    ws.send(Message::Close(None)).await.unwrap();
    while ws.next().await.is_some() {}
    drop(ws);
    assert!(
        counts_settle(dp, endpoint, 0.0).await,
        "{:?}",
        in_flight_of(dp, endpoint)
    );
}

/// Whether `endpoint`'s in-flight count reaches `want` within two seconds (a session is
/// counted until the dataplane sees both of its ends close).
async fn counts_settle(dp: &Dataplane, endpoint: SocketAddr, want: f64) -> bool {
    eventually(Duration::from_secs(2), || {
        in_flight_of(dp, endpoint) == Some(want)
    })
    .await
}

/// A dataplane serving `/ws*` from `backend` with `plugin` on the route.
async fn ws_dataplane_with(backend: SocketAddr, plugin: v1::Plugin) -> Dataplane {
    let dp = dataplane().await;
    let route = v1::Route {
        plugins: vec![plugin],
        ..ws_route(true, "u")
    };
    dp.store
        .apply(
            snapshot(1, vec![route], vec![upstream("u", &[(backend, 1)])]),
            vec![],
        )
        .unwrap();
    dp
}

#[tokio::test]
async fn limit_conn_counts_an_open_session_until_it_ends() {
    // APISIX releases limit-conn in the log phase, which for a WebSocket runs when the
    // session closes: `conn: 1` allows one open session per client, not one handshake.
    let backend = ws_server("ws1").await;
    let dp = ws_dataplane_with(
        backend,
        plugin(
            "limit-conn",
            serde_json::json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1,
                               "key": "remote_addr", "rejected_msg": "one session at a time"}),
        ),
    )
    .await;
    let url = format!("ws://{}/ws/one", dp.addr);
    let (mut first, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    assert_eq!(next_text(&mut first).await, "hello from ws1 /ws/one");

    // While it is open, a second session is refused with limit-conn's answer.
    match tokio_tungstenite::connect_async(&url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 503);
            let body = String::from_utf8(resp.body().clone().unwrap_or_default()).unwrap();
            assert!(body.contains("one session at a time"), "{body}");
        }
        other => panic!("expected 503, got {other:?}"),
    }
    first.send(Message::text("still here")).await.unwrap();
    assert_eq!(next_text(&mut first).await, "ws1: still here");

    // Once it ends, the slot is free again.
    first.close(None).await.unwrap();
    while first.next().await.is_some() {}
    drop(first);
    let url = &url;
    let (mut second, _) = eventually_async(
        Wait::up_to(Duration::from_secs(2)).every(Duration::from_millis(20)),
        || async move { tokio_tungstenite::connect_async(url).await },
    )
    .await
    .expect("a session once the first one closed");
    assert_eq!(next_text(&mut second).await, "hello from ws1 /ws/one");
}

#[tokio::test]
async fn prometheus_logs_a_session_once_when_it_ends_with_its_bytes_and_duration() {
    let backend = ws_server("ws1").await;
    let dp = ws_dataplane_with(backend, plugin("prometheus", serde_json::json!({}))).await;
    let node = backend.ip().to_string();
    let labels = format!("route=\"default/ws/r1\",service=\"\",consumer=\"\",node=\"{node}\"");
    let status = format!(
        "apisix_http_status{{code=\"101\",route=\"default/ws/r1\",matched_uri=\"/ws*\",matched_host=\"\",service=\"\",consumer=\"\",node=\"{node}\"}}"
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws/m", dp.addr))
        .await
        .unwrap();
    assert_eq!(next_text(&mut ws).await, "hello from ws1 /ws/m");
    let big = "x".repeat(10_000);
    ws.send(Message::text(big.clone())).await.unwrap();
    assert_eq!(next_text(&mut ws).await, format!("ws1: {big}"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Still open: not logged yet.
    assert_eq!(sample(&dp.store.render_metrics(), &status), None);

    ws.close(None).await.unwrap();
    while ws.next().await.is_some() {}
    drop(ws);
    eventually(Duration::from_secs(2), || {
        sample(&dp.store.render_metrics(), &status)
    })
    .await;
    let text = dp.store.render_metrics();
    assert_eq!(sample(&text, &status), Some(1.0), "logged once: {text}");
    let latency = format!("apisix_http_latency_sum{{type=\"request\",{labels}}}");
    let ms = sample(&text, &latency).unwrap();
    assert!(
        ms >= 200.0,
        "the session lasted over 200 ms, logged {ms} ms"
    );
    for (kind, at_least) in [("ingress", 10_000.0), ("egress", 10_005.0)] {
        let series = format!("apisix_bandwidth{{type=\"{kind}\",{labels}}}");
        let bytes = sample(&text, &series).unwrap();
        assert!(bytes >= at_least, "{kind}: {bytes} bytes: {text}");
    }
}
