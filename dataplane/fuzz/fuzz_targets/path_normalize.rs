//! Path normalisation: never panics, never climbs above the root, and normalising what it
//! forwards changes nothing (idempotent).
#![no_main]

use sluice_dataplane::http::path::normalize;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let path = format!("/{raw}");
    let Ok(normal) = normalize(&path) else { return };
    let (decoded, encoded) = match normal {
        None => (path.clone(), path.clone()),
        Some(n) => (n.decoded, n.encoded),
    };
    assert!(encoded.starts_with('/'), "{path:?} -> {encoded:?}");
    assert!(!encoded.contains("//"), "{path:?} -> {encoded:?}");
    assert!(
        !decoded.split('/').any(|s| s == ".." || s == "."),
        "{path:?} -> {decoded:?}"
    );
    if let Some(again) = normalize(&encoded).expect("the forwarded form is valid") {
        assert_eq!(again.decoded, decoded, "{path:?}");
        assert_eq!(again.encoded, encoded, "{path:?}");
    }
});
