//! YAML as a user could apply it, through the translate function: per-document errors or a
//! snapshot with conditions; never a panic. Ingresses of class `nginx` go through
//! ingress-nginx's annotations too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut state = sluice_translate::ClusterState::new();
    if state.load_yaml("fuzz.yaml", text).is_err() {
        return;
    }
    let opts = sluice_translate::Options {
        nginx_classes: vec!["nginx".into()],
        ..sluice_translate::Options::default()
    };
    let _ = sluice_translate::translate(&state, &opts);
});
