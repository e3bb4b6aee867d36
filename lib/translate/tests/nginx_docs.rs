//! docs/ingress-nginx.md's annotation table says, for every annotation of the code's table
//! (`nginx::ANNOTATIONS`), the verdict the code gives it, and lists no annotation the code
//! does not know: the two cannot drift.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_translate::nginx::{ANNOTATIONS, support};

#[test]
fn the_docs_table_matches_the_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ingress-nginx.md");
    let doc = std::fs::read_to_string(&root).unwrap();
    let mut seen = 0;
    let table = doc
        .split_once("## Annotations: ingress-nginx, Traefik, Sluice")
        .expect("the annotation table's section")
        .1;
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let name = cells[0].trim_start_matches("| `").trim_end_matches('`');
        let sluice = cells.last().unwrap();
        let want = support(name).unwrap_or_else(|| panic!("{name}: in the docs, not in the code"));
        assert!(
            sluice.starts_with(&format!("**{}**", want.verdict())),
            "{name}: the docs say {sluice:?}, the code {}",
            want.verdict()
        );
        assert!(
            sluice.contains(want.why().replace('|', "\\|").as_str()),
            "{name}: {sluice:?}"
        );
        seen += 1;
    }
    assert_eq!(
        seen,
        ANNOTATIONS.len(),
        "every annotation of the code is in the docs"
    );
}
