//! Offline translation: files → [`ClusterState`](sluice_translate::ClusterState) →
//! snapshot → compiled [`RouteTable`], exactly as the controller and the dataplane do it.

use std::io::Read as _;
use std::path::Path;

use sluice_dataplane::config::table::{InvalidSnapshot, RouteTable};
use sluice_dataplane::upstream::PoolRegistry;
use sluice_proto::v1;
use sluice_translate::files::{Loaded, SourceError};
use sluice_translate::{Options, Translation, translate};

/// The controller's default `--ingress-class` (`sluice_controller::cluster::DEFAULT_INGRESS_CLASS`;
/// not imported, to keep the controller's dependencies out of this binary).
pub const DEFAULT_INGRESS_CLASS: &str = "apisix";

/// Why the input could not be read at all (exit code 2 in `main`).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A file, directory or stdin could not be read, or a file is not YAML.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Standard input could not be read.
    #[error("-: {0}")]
    Stdin(std::io::Error),
    /// No `-f` given.
    #[error("no input: give -f FILE|DIR|- at least once")]
    NoInput,
}

/// Files read, translated and compiled.
pub struct Offline {
    /// Objects and the documents left out.
    pub loaded: Loaded,
    /// The controller's output for them.
    pub translation: Translation,
    /// The dataplane's compiled table, or why the dataplane would reject (NACK) the snapshot.
    pub table: Result<RouteTable, InvalidSnapshot>,
}

/// Reads every source: a file, a directory (its `*.yaml`/`*.yml`, recursively) or `-` for
/// standard input.
pub fn load_sources(sources: &[String]) -> Result<Loaded, InputError> {
    if sources.is_empty() {
        return Err(InputError::NoInput);
    }
    let mut loaded = Loaded::default();
    for source in sources {
        if source == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(InputError::Stdin)?;
            loaded.load_text("-", &text)?;
        } else {
            loaded.load_path(Path::new(source))?;
        }
    }
    Ok(loaded)
}

/// Translation options as the controller uses them: its ingress class, certificates checked
/// against the current time.
pub fn controller_options(ingress_class: &str) -> Options {
    Options {
        ingress_class: Some(ingress_class.to_owned()).filter(|c| !c.is_empty()),
        now: Some(std::time::SystemTime::now()),
        ..Options::default()
    }
}

impl Offline {
    /// Translates `loaded` with `opts` and compiles the snapshot with the dataplane's code.
    pub fn build(loaded: Loaded, opts: &Options) -> Self {
        let translation = translate(&loaded.state, opts);
        let table = RouteTable::compile(&translation.snapshot, &PoolRegistry::default());
        Offline {
            loaded,
            translation,
            table,
        }
    }

    /// Reads `sources` and builds.
    pub fn from_sources(sources: &[String], opts: &Options) -> Result<Self, InputError> {
        Ok(Self::build(load_sources(sources)?, opts))
    }
}

/// Compiles a snapshot that a dataplane served redacted (`/snapshot?full=1`): its
/// certificates and upstream client keys are left out, having no key material any more;
/// routes, plugins and upstreams compile with the dataplane's code as usual. Certificates
/// are then chosen by id ([`sluice_dataplane::config::certs::SniIndex::ids`]).
pub fn compile_redacted(snapshot: &v1::Snapshot) -> Result<RouteTable, InvalidSnapshot> {
    let mut s = snapshot.clone();
    s.tls_certificates.clear();
    s.default_certificate = None;
    s.fallback_sni.clear();
    for up in &mut s.upstreams {
        if let Some(tls) = up.tls.as_mut() {
            tls.client_cert_pem.clear();
            tls.client_key_pem.clear();
        }
    }
    RouteTable::compile(&s, &PoolRegistry::default())
}
