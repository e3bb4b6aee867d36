//! A snapshot as a faulty or hostile controller could push it: decoded and compiled, or
//! refused with an error; never a panic.
#![no_main]

use prost::Message as _;
use sluice_dataplane::config::store::Store;
use sluice_proto::v1;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(mut snapshot) = v1::Snapshot::decode(data) else {
        return;
    };
    // NB: nothing may leave the machine: endpoints (active health probes, DNS) point at a
    // closed loopback port, and plugin configurations that name a Redis server are
    // dropped. Addresses play no part in compiling.
    for up in &mut snapshot.upstreams {
        for e in &mut up.endpoints {
            e.host = "127.0.0.1".to_owned();
            e.port = 1;
        }
    }
    let local = |p: &v1::Plugin| !p.config_json.to_ascii_lowercase().contains("redis");
    for r in &mut snapshot.routes {
        r.plugins.retain(local);
    }
    for g in &mut snapshot.global_rules {
        g.plugins.retain(local);
    }
    for c in &mut snapshot.consumers {
        c.plugins.retain(local);
    }
    let Ok(store) = Store::new() else { return };
    let _ = store.apply(snapshot, vec![]);
});
