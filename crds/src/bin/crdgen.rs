//! Prints the CRDs of all `apisix.apache.org/v2` kinds as one multi-document YAML.
//!
//! Usage: `cargo run -p sluice-crds --bin crdgen > crds/apisix-crds.yaml`
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let yaml = match sluice_crds::crds_yaml() {
        Ok(yaml) => yaml,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(yaml.as_bytes())
        .and_then(|()| stdout.flush())
    {
        eprintln!("crdgen: cannot write to stdout: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
