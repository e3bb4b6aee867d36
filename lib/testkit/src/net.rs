//! Loopback addresses for tests.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

/// `127.0.0.1:0`: any free loopback port.
pub fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An address on which nothing listens (a port bound and released at once).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A loopback port free to listen on, for a process started next (bound and released at
/// once, like [`closed_port`]).
pub fn free_port() -> SocketAddr {
    closed_port()
}
