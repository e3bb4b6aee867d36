//! The command line: flags, help and examples. Here rather than in `main.rs` so that
//! `completion` and the tests can walk the same `clap::Command`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueHint};

use crate::Format;
use crate::completion::Shell;
use crate::offline::DEFAULT_INGRESS_CLASS;

/// `FIRST-LAST`, as the controller's --gateway-listener-ports.
fn port_range(raw: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (a, b) = raw
        .split_once('-')
        .ok_or_else(|| format!("{raw:?}: expected FIRST-LAST"))?;
    let parse = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{p:?}: expected a port"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a > b {
        return Err(format!("{raw:?}: FIRST is above LAST"));
    }
    Ok(a..=b)
}

/// Checks `--stream-ports` as the controller does; kept as text (clap reads a `Vec` as
/// repeated values).
fn stream_ports(raw: &str) -> Result<String, String> {
    sluice_translate::parse_stream_ports(raw).map(|_| raw.to_owned())
}

const EXAMPLES: &str = "\
Examples:
  kubectl sluice validate -f manifests/
  cat route.yaml | kubectl sluice validate -f - -f services.yaml
  kubectl sluice explain http://api.example.com/v1/users -X POST \\
      -H 'x-canary: 1' --client-ip 10.1.2.3 -f manifests/
  kubectl sluice diff -f new/ --against old/
  kubectl sluice diff -f new/ --against http://127.0.0.1:9090
  kubectl sluice status -A
  kubectl get ingress -A -o yaml | kubectl sluice migrate -f -
  source <(kubectl sluice completion bash)

Exit codes: 0 ok, 1 rejected objects (validate), differences (diff), objects not
Accepted/Programmed (status) or Ingresses Sluice would refuse (migrate), 2 usage,
unreadable input or unreachable cluster.";

const VALIDATE_EXAMPLES: &str = "\
Examples:
  kubectl sluice validate -f manifests/
  kubectl get apisixroutes -A -o yaml | kubectl sluice validate -f -
  kubectl sluice validate -f route.yaml -o json";

const EXPLAIN_EXAMPLES: &str = "\
Examples:
  kubectl sluice explain http://api.example.com/v1/users -f manifests/
  kubectl sluice explain https://api.example.com/v1/orders -X POST \\
      -H 'x-canary: 1' --client-ip 10.1.2.3 -f manifests/ -o yaml
  kubectl sluice explain http://api.example.com/v1/users            # the cluster
  kubectl -n sluice port-forward deploy/sluice-dataplane 9091 &
  kubectl sluice explain http://api.example.com/v1/users --admin http://127.0.0.1:9091
  kubectl sluice explain tls://db.example.com:9443 -f manifests/ --stream-ports tls:9443
  kubectl sluice explain tcp://:9100 --client-ip 10.1.2.3 --stream-ports tcp:9100
  kubectl sluice explain tls://foo.example.com:443 -f gw/ \
      --gateway-listener-ports 20000-29999";

const DIFF_EXAMPLES: &str = "\
Examples:
  kubectl sluice diff -f new/ --against old/
  kubectl sluice diff -f new/ --against http://127.0.0.1:9090";

const MIGRATE_EXAMPLES: &str = "\
Examples:
  kubectl get ingress -A -o yaml | kubectl sluice migrate -f -
  kubectl sluice migrate -f ingresses/ --class nginx,nginx-internal -o json

Exit codes: 0 every Ingress would be served, 1 one would be refused (its annotations
say why), 2 usage or unreadable input.";

const STATUS_EXAMPLES: &str = "\
Examples:
  kubectl sluice status
  kubectl sluice status -A -o json
  kubectl sluice status -n shop --context prod --kubeconfig ~/.kube/prod";

const COMPLETION_EXAMPLES: &str = "\
Examples:
  kubectl sluice completion bash > /etc/bash_completion.d/kubectl-sluice
  source <(kubectl sluice completion bash)
  kubectl sluice completion zsh > \"${fpath[1]}/_kubectl-sluice\"
  kubectl sluice completion fish > ~/.config/fish/completions/kubectl-sluice.fish";

/// Validate, explain and diff Sluice configuration offline, exactly as the controller
/// translates it and the dataplane routes it; show what the cluster's dataplanes serve.
#[derive(Parser)]
#[command(name = "kubectl-sluice", version, after_help = EXAMPLES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every offline subcommand shares.
#[derive(clap::Args)]
pub struct Input {
    /// A YAML file, a directory of them (recursive), or `-` for stdin. Repeatable.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE|DIR|-",
        value_hint = ValueHint::AnyPath,
        required = true
    )]
    pub files: Vec<String>,
    /// The controller's --ingress-class: Ingresses and Apisix objects of another class are
    /// ignored, as the controller ignores them. Empty: translate everything.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_INGRESS_CLASS)]
    pub ingress_class: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

/// The subcommands.
// NB: parsed once per run; boxing `Explain`'s flags would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Translate files as the controller would; list rejected objects (kind, namespace/name,
    /// field, reason) and warnings. Exit 1 when anything is rejected.
    #[command(after_help = VALIDATE_EXAMPLES)]
    Validate {
        /// The files.
        #[command(flatten)]
        input: Input,
    },
    /// Which route serves a request, why, with which plugins, to which endpoints: against
    /// files (-f), a running dataplane (--admin), or else the cluster's objects (current
    /// kubeconfig context). For a layer-4 connection (`tcp://`, `tls://`, `udp://`): which
    /// listener, stream route and backend it gets.
    #[command(after_help = EXPLAIN_EXAMPLES)]
    Explain {
        /// The request URL (`http://host/path?query`; no scheme means http), or a
        /// connection: `tcp://[HOST]:PORT`, `tls://SNI:PORT`, `udp://[HOST]:PORT`, PORT
        /// being the dataplane's (a --stream-ports port or a Gateway listener's).
        #[arg(value_hint = ValueHint::Url)]
        url: String,
        /// Request method.
        #[arg(short = 'X', long = "request", default_value = "GET")]
        method: String,
        /// A request header `name: value`. Repeatable; `Host:` overrides the URL's host.
        #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// Client address the dataplane sees.
        #[arg(long, default_value = "192.0.2.1")]
        client_ip: IpAddr,
        /// TLS server name (defaults to the URL host for https:// and tls://).
        #[arg(long)]
        sni: Option<String>,
        /// A connection's listener by id (`stream/tcp/9100`, `<ns>/<gateway>/<port>`),
        /// when its port does not tell.
        #[arg(long, value_name = "ID")]
        listener: Option<String>,
        /// The controller's --stream-ports (`tcp:9100,udp:9200,tls:9443`, the chart's
        /// `dataplane.stream.ports`): ApisixRoute `spec.stream` rules need their port
        /// declared. Not used with --admin (the snapshot has its listeners).
        #[arg(long, value_name = "PROTO:PORT,...", value_parser = stream_ports)]
        stream_ports: Option<String>,
        /// The controller's --gateway-listener-ports (`FIRST-LAST`, with per-Gateway
        /// Services): Gateway ports get dataplane ports of their own, which TLS, TCP and UDP
        /// listeners need. Not used with --admin.
        #[arg(long, value_name = "FIRST-LAST", value_parser = port_range)]
        gateway_listener_ports: Option<std::ops::RangeInclusive<u16>>,
        /// A YAML file, a directory of them (recursive), or `-` for stdin. Repeatable.
        #[arg(
            short = 'f',
            long = "filename",
            value_name = "FILE|DIR|-",
            value_hint = ValueHint::AnyPath,
            conflicts_with_all = ["admin", "kubeconfig", "context", "namespace"]
        )]
        files: Vec<String>,
        /// A running dataplane's admin listener (http://HOST:PORT; for a pod, after
        /// `kubectl port-forward POD 9091`): its snapshot and live endpoint health.
        #[arg(long, value_name = "URL", value_hint = ValueHint::Url,
              conflicts_with_all = ["kubeconfig", "context", "namespace"])]
        admin: Option<String>,
        /// Kubeconfig file, when reading the cluster (default: $KUBECONFIG, else
        /// ~/.kube/config, else in-cluster).
        #[arg(long, value_name = "PATH", value_hint = ValueHint::FilePath)]
        kubeconfig: Option<PathBuf>,
        /// Kubeconfig context, when reading the cluster (default: its current context).
        #[arg(long, value_name = "NAME")]
        context: Option<String>,
        /// Read objects of this namespace only, as a controller with --watch-namespace
        /// does (default: every namespace).
        #[arg(short = 'n', long, value_name = "NS")]
        namespace: Option<String>,
        /// The controller's --ingress-class: Ingresses and Apisix objects of another class
        /// are left out, as the controller leaves them out.
        #[arg(long, value_name = "NAME", default_value = DEFAULT_INGRESS_CLASS)]
        ingress_class: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
        output: Format,
        /// Longest the whole read of --admin may take (`30s`, `2m`, or seconds).
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
        request_timeout: Duration,
    },
    /// What changes in the snapshot if the files are applied: added, removed and changed
    /// routes, upstreams, certificates (never secret material). Exit 1 on differences.
    #[command(after_help = DIFF_EXAMPLES)]
    Diff {
        /// The files.
        #[command(flatten)]
        input: Input,
        /// What is served now: files (repeatable), or a dataplane admin URL
        /// (http://HOST:PORT, reads /snapshot?full=1).
        #[arg(long, value_name = "FILE|DIR|URL", value_hint = ValueHint::AnyPath, required = true)]
        against: Vec<String>,
        /// Longest the whole read of an --against URL may take (`30s`, `2m`, or seconds).
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
        request_timeout: Duration,
    },
    /// What Sluice does with Ingresses written for ingress-nginx: per Ingress and per
    /// `nginx.ingress.kubernetes.io/*` annotation, served as is, served differently (how),
    /// refused (why) or ignored. Exit 1 when an Ingress would not be served.
    #[command(after_help = MIGRATE_EXAMPLES)]
    Migrate {
        /// Ingress YAML: a file, a directory of them (recursive), or `-` for stdin (e.g.
        /// `kubectl get ingress -A -o yaml`). Repeatable.
        #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", value_hint = ValueHint::AnyPath, required = true)]
        files: Vec<String>,
        /// The classes to take over (comma-separated or repeated), as the chart's
        /// `ingressClass.nginxClasses`.
        #[arg(
            long = "class",
            value_name = "NAME",
            value_delimiter = ',',
            default_value = "nginx"
        )]
        classes: Vec<String>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Every dataplane (its controller replica, the snapshot version and hash it serves,
    /// ACK/NACK with reasons) and every object not Accepted or not Programmed, read from
    /// the cluster. Exit 1 unless all are Accepted and Programmed.
    #[command(after_help = STATUS_EXAMPLES)]
    Status {
        /// Namespace of the objects to check (default: the context's). The controller
        /// replicas' records are read from every namespace the kubeconfig may list.
        #[arg(short = 'n', long, value_name = "NS")]
        namespace: Option<String>,
        /// Check objects in every namespace.
        #[arg(short = 'A', long, conflicts_with = "namespace")]
        all_namespaces: bool,
        /// Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
        #[arg(long, value_name = "PATH", value_hint = ValueHint::FilePath)]
        kubeconfig: Option<PathBuf>,
        /// Kubeconfig context (default: its current context).
        #[arg(long, value_name = "NAME")]
        context: Option<String>,
        /// The controller's --ingress-class: objects of another class are not checked.
        #[arg(long, value_name = "NAME", default_value = DEFAULT_INGRESS_CLASS)]
        ingress_class: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Print a shell completion script (bash, zsh or fish) to stdout.
    #[command(after_help = COMPLETION_EXAMPLES)]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
}

/// A duration: `<n>s`, `<n>m` or `<n>` seconds, at least one second and at most an hour.
fn duration(text: &str) -> Result<Duration, String> {
    let (digits, unit) = match text.strip_suffix('m') {
        Some(d) => (d, 60),
        None => (text.strip_suffix('s').unwrap_or(text), 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s or 2m"))?;
    let secs = n.saturating_mul(unit);
    if !(1..=3600).contains(&secs) {
        return Err(format!("{text:?} is not between 1s and 1h"));
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn flags_are_consistent() {
        Cli::command().debug_assert();
    }

    /// `--help` of every subcommand shows at least one example of it.
    #[test]
    fn every_subcommand_has_an_example() {
        let mut cmd = Cli::command();
        let top = cmd.render_long_help().to_string();
        // NB: clap's own `help` subcommand needs no example.
        for sub in cmd.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            let name = sub.get_name().to_owned();
            let help = sub.render_long_help().to_string();
            let example = format!("kubectl sluice {name}");
            assert!(
                help.contains(&example),
                "{name} --help has no example:\n{help}"
            );
            assert!(
                top.contains(&example),
                "--help has no example of {name}:\n{top}"
            );
        }
    }
}
