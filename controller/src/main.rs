//! `sluice-controller`: parses flags and wires the controller library together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use sluice_controller::app::{self, Settings};
use sluice_controller::cluster::DEFAULT_INGRESS_CLASS;
use sluice_controller::grpc;
use sluice_controller::leader::{self, LeaseConfig};
use sluice_controller::metrics::Metrics;
use sluice_controller::rebuild::{Debounce, TlsSettings};
use sluice_controller::status::Publish;
use sluice_controller::status::gateway_services::Placement;
use sluice_controller::tls::{self, TlsFiles};
use sluice_controller::watch::Scope;
use sluice_process::{LogFormat, init_logs, shutdown_signal};
use sluice_translate::CrossNamespaceRefs;
use sluice_translate::gateway::{DEFAULT_CONTROLLER_NAME, GatewayOptions};

/// Sluice controller: watches ApisixRoute & co., Ingress, the Gateway API (when installed),
/// Services, EndpointSlices and Secrets, translates them into route snapshots and pushes those to the dataplanes over
/// mutually authenticated gRPC.
/// Channel of the installed Gateway API CRDs (`--gateway-api-channel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum GatewayApiChannel {
    Standard,
    Experimental,
}

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Kubeconfig file. Default: in-cluster configuration, else $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Ingress class this controller owns: objects whose `ingressClassName` (or, for
    /// Ingress, the `kubernetes.io/ingress.class` annotation) is this name, and objects that
    /// name no class when the IngressClass of this name is the cluster default. The default
    /// `apisix` makes manifests written for the APISIX ingress controller work unchanged.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_INGRESS_CLASS)]
    ingress_class: String,
    /// Also serve the Ingresses of these classes (comma-separated or repeated), in
    /// ingress-nginx's place: their `nginx.ingress.kubernetes.io/*` annotations are honoured
    /// with ingress-nginx's behaviour, snippets refused (docs/ingress-nginx.md). Run beside
    /// the old controller and take over class by class. Default: none.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    ingress_nginx_class: Vec<String>,
    /// A setting of ingress-nginx's ConfigMap for those classes (repeatable): `ssl-redirect`,
    /// `force-ssl-redirect`, `http-redirect-code`, `proxy-body-size`, `proxy-*-timeout`,
    /// `whitelist-source-range`, `denylist-source-range`, `limit-req-status-code`, `hsts*`,
    /// `use-forwarded-headers`, `enable-real-ip`, `proxy-real-ip-cidr`,
    /// `forwarded-for-header` (docs/ingress-nginx.md).
    #[arg(long, value_name = "KEY=VALUE", value_parser = sluice_translate::nginx::parse_config)]
    ingress_nginx_config: Vec<(String, String)>,
    /// gRPC listener the dataplanes dial for snapshots.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:18000")]
    grpc_listen: SocketAddr,
    /// Listener for /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9092")]
    metrics_listen: SocketAddr,
    /// Watch only this namespace (repeat the flag or separate with commas). Default: all.
    #[arg(long, value_name = "NS", value_delimiter = ',')]
    watch_namespace: Vec<String>,
    /// Elect a leader with a Lease; only the leader writes status and events. Every
    /// replica serves dataplanes, leader or not, and records what its dataplanes serve in a
    /// Lease of its own (`<lease-name>-<identity>`), so the leader counts them all.
    #[arg(long)]
    leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(long, value_name = "NAME", default_value = "sluice-controller")]
    lease_name: String,
    /// Namespace of the Lease. Default: $POD_NAMESPACE, else the kubeconfig's namespace.
    #[arg(long, value_name = "NS", env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Identity of this replica in the Lease. Default: $POD_NAME, else $HOSTNAME.
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    identity: Option<String>,
    /// PEM certificate chain of the gRPC server.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle dataplane (client) certificates must chain to.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Serve gRPC in plaintext. Refused unless --grpc-listen is a loopback address
    /// (snapshots carry TLS keys).
    #[arg(long)]
    insecure: bool,
    /// Least time between the starts of two snapshot rebuilds, in milliseconds. A change
    /// that finds no rebuild running is rebuilt at once; changes during a rebuild (or within
    /// this interval) share the next one.
    #[arg(long, value_name = "MS", default_value_t = 10)]
    rebuild_min_interval: u64,
    /// Ingress `status.loadBalancer`: the address of this Service (`NAMESPACE/NAME`, usually
    /// the dataplane's Service), as APISIX's `ingress_publish_service`.
    #[arg(
        long,
        value_name = "NS/NAME",
        conflicts_with = "ingress_status_address"
    )]
    ingress_publish_service: Option<String>,
    /// Ingress `status.loadBalancer`: these IPs or host names (repeat the flag or separate
    /// with commas), as APISIX's `ingress_status_address`.
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    ingress_status_address: Vec<String>,
    /// The kubernetes.io/tls Secret (`NAMESPACE/NAME`) served to TLS handshakes without SNI
    /// or for a host no certificate covers, as ingress-nginx's flag of the same name; never
    /// for a host another certificate covers. Must be in a watched namespace. A missing or
    /// bad Secret is logged and listed with the rejected objects on each dataplane's
    /// /snapshot; those handshakes are then refused. Default: they are refused.
    #[arg(long, value_name = "NS/NAME", value_parser = secret_ref)]
    default_ssl_certificate: Option<(String, String)>,
    /// A TLS handshake without SNI gets the certificate of this host (APISIX's
    /// `apisix.ssl.fallback_sni`), before the default certificate.
    #[arg(long, value_name = "HOST", value_parser = fallback_sni)]
    fallback_sni: Option<String>,
    /// The dataplanes' Service (`NAMESPACE/NAME`): its ready, not terminating endpoints
    /// (by pod name, which each dataplane reports as its --dataplane-id) are the dataplanes
    /// that should serve, and `Programmed` is True only when every one of them serves the
    /// object. Default: `Programmed` counts the dataplanes connected to some replica.
    #[arg(long, value_name = "NS/NAME", value_parser = service_ref)]
    dataplane_service: Option<(String, String)>,
    /// Gateway API: GatewayClasses with this `spec.controllerName` are served by Sluice.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    gateway_controller_name: String,
    /// Gateway API: the channel of the installed CRDs. `experimental` also claims the
    /// features whose fields only that channel has (HTTPRoute `retry`) in the GatewayClass's
    /// `supportedFeatures`; routes use those fields with either value when the CRDs have them.
    #[arg(long, value_enum, value_name = "CHANNEL", default_value = "standard")]
    gateway_api_channel: GatewayApiChannel,
    /// Gateway API: the port clients reach the dataplanes' plain-HTTP listener on (the
    /// dataplane Service's port). Gateway HTTP listeners on other ports are
    /// `PortUnavailable`.
    #[arg(long, value_name = "PORT", default_value_t = 80)]
    gateway_http_port: u16,
    /// Gateway API: the port of the dataplanes' HTTPS listener, likewise.
    #[arg(long, value_name = "PORT", default_value_t = 443)]
    gateway_https_port: u16,
    /// Gateway API: give each Gateway its own Service, in this namespace (the dataplanes'),
    /// so each Gateway has its own address and ports; the dataplanes open a port of their
    /// own for each port of each Gateway (`--gateway-listener-ports`). Default: every
    /// Gateway shares the dataplane Service (`--gateway-http-port`, `--gateway-https-port`).
    #[arg(long, value_name = "NAMESPACE", requires = "gateway_service_selector")]
    gateway_service_namespace: Option<String>,
    /// Labels of the dataplane pods, the Gateway Services' selector (`k=v,k2=v2`).
    #[arg(long, value_name = "SELECTOR", value_parser = sluice_controller::status::gateway_services::parse_selector)]
    gateway_service_selector: Option<std::collections::BTreeMap<String, String>>,
    /// Type of the Gateway Services.
    #[arg(long, value_name = "TYPE", default_value = "ClusterIP", value_parser = ["ClusterIP", "NodePort", "LoadBalancer"])]
    gateway_service_type: String,
    /// Where each Gateway's Service lives: `dataplane` (the dataplanes' namespace, selecting
    /// their pods) or `gateway` (the Gateway's own namespace, owned by the Gateway, its
    /// EndpointSlices mirrored from a headless Service in the dataplanes' namespace; needs
    /// write access to Services and EndpointSlices in every namespace).
    #[arg(long, value_name = "WHERE", default_value = "dataplane", value_parser = ["dataplane", "gateway"])]
    gateway_service_placement: String,
    /// The dataplane ports Gateway ports are given from (`FIRST-LAST`), with
    /// `--gateway-service-namespace`. Keep them clear of the dataplanes' other ports.
    #[arg(long, value_name = "FIRST-LAST", default_value = "20000-29999", value_parser = port_range)]
    gateway_listener_ports: std::ops::RangeInclusive<u16>,
    /// The dataplanes' layer-4 ports for ApisixRoute `spec.stream` rules:
    /// `tcp:9100,udp:9200,tls:9443` (`tls:` ports terminate TLS by SNI with the ApisixTls
    /// certificates). Each is opened by every dataplane; a rule on another port is refused.
    /// Default: none.
    #[arg(long, value_name = "PROTO:PORT,...", default_value = "", value_parser = sluice_translate::parse_stream_ports)]
    stream_ports: StreamPorts,
    /// Honour every cross-namespace reference of the APISIX kinds (ApisixUpstream
    /// `tlsSecret`, ApisixTls `secret` and `client.caSecret`, ApisixRoute
    /// `plugin_config_namespace`), as APISIX does. Default: a reference to another namespace
    /// is honoured only when a Gateway API ReferenceGrant there allows it; others are refused
    /// (`RefNotPermitted`), so one tenant cannot use another's Secrets or plugin configs.
    #[arg(long)]
    allow_cross_namespace_refs: bool,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn port_range(raw: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (a, b) = raw
        .split_once('-')
        .ok_or_else(|| format!("{raw:?}: expected FIRST-LAST"))?;
    let parse = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p >= 1024)
            .ok_or_else(|| format!("{p:?}: expected a port from 1024 to 65535"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a > b {
        return Err(format!("{raw:?}: FIRST is above LAST"));
    }
    Ok(a..=b)
}

fn service_ref(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{raw:?}: expected NAMESPACE/NAME")),
    }
}

fn secret_ref(raw: &str) -> Result<(String, String), String> {
    sluice_translate::parse_secret_ref(raw)
}

/// `--stream-ports`; NB: an alias, so clap takes the whole list as one value.
type StreamPorts = Vec<sluice_translate::StreamPort>;

fn fallback_sni(raw: &str) -> Result<String, String> {
    sluice_translate::parse_fallback_sni(raw)
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("no in-cluster configuration and no kubeconfig")?,
    };
    Ok(Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logs(args.log_format);
    tls::install_crypto_provider();

    // Refuse an unsafe channel before touching the cluster.
    let files = TlsFiles::from_flags(
        args.tls_cert.clone(),
        args.tls_key.clone(),
        args.tls_ca.clone(),
    )?;
    let server_tls = tls::channel_security(args.grpc_listen, files.as_ref(), args.insecure)?;
    let grpc_listener = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding --grpc-listen {}", args.grpc_listen))?;
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;

    let publish = match (&args.ingress_publish_service, &args.ingress_status_address) {
        (Some(svc), _) => Some(Publish::service(svc)?),
        (None, addrs) if !addrs.is_empty() => Some(Publish::Addresses(addrs.clone())),
        _ => None,
    };
    let client = kube_client(args.kubeconfig.as_ref()).await?;
    let lease = if args.leader_elect {
        let namespace = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let identity = args
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty())
            .context("--leader-elect needs --identity (or $POD_NAME / $HOSTNAME)")?;
        Some(LeaseConfig::new(&args.lease_name, &namespace, &identity))
    } else {
        None
    };
    let settings = Settings {
        ingress_class: args.ingress_class.clone(),
        scope: if args.watch_namespace.is_empty() {
            Scope::All
        } else {
            Scope::Namespaces(args.watch_namespace.clone())
        },
        debounce: Debounce {
            min_interval: Duration::from_millis(args.rebuild_min_interval),
        },
        lease: lease.clone(),
        publish,
        instance: args
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty()),
        tls: TlsSettings {
            default_certificate: args.default_ssl_certificate.clone(),
            fallback_sni: args.fallback_sni.clone(),
        },
        dataplane_service: args.dataplane_service.clone(),
        gateway: GatewayOptions {
            controller_name: args.gateway_controller_name.clone(),
            http_port: args.gateway_http_port,
            https_port: args.gateway_https_port,
            listener_ports: args
                .gateway_service_namespace
                .as_ref()
                .map(|_| args.gateway_listener_ports.clone()),
            experimental_channel: args.gateway_api_channel == GatewayApiChannel::Experimental,
            services_in_gateway_namespace: args.gateway_service_namespace.is_some()
                && args.gateway_service_placement == "gateway",
        },
        gateway_services: match (
            &args.gateway_service_namespace,
            &args.gateway_service_selector,
        ) {
            (Some(namespace), Some(selector)) => Some(sluice_controller::status::GatewayServices {
                namespace: namespace.clone(),
                selector: selector.clone(),
                type_: args.gateway_service_type.clone(),
                placement: if args.gateway_service_placement == "gateway" {
                    Placement::Gateway
                } else {
                    Placement::Dataplane
                },
            }),
            _ => None,
        },
        cross_namespace_refs: if args.allow_cross_namespace_refs {
            CrossNamespaceRefs::Allow
        } else {
            CrossNamespaceRefs::RequireGrant
        },
        stream_ports: args.stream_ports.clone(),
        nginx_classes: args.ingress_nginx_class.clone(),
        nginx_config: args.ingress_nginx_config.iter().cloned().collect(),
    };
    let running = app::start(client.clone(), settings, Metrics::new()?);
    let hub = Arc::clone(&running.hub);
    let metrics = running.metrics.clone();

    let ready_hub = Arc::clone(&hub);
    let readiness: sluice_controller::http::Readiness = Arc::new(move || {
        if ready_hub.current().is_some() {
            Ok(())
        } else {
            Err("caches not synced yet: no snapshot built".into())
        }
    });
    tokio::spawn(sluice_controller::http::serve(
        metrics_listener,
        metrics.clone(),
        readiness,
    ));

    tracing::info!(
        grpc = %args.grpc_listen,
        metrics = %args.metrics_listen,
        ingress_class = %args.ingress_class,
        namespaces = ?args.watch_namespace,
        leader_elect = args.leader_elect,
        dataplane_service = ?args.dataplane_service,
        tls = server_tls.is_some(),
        "sluice-controller starting"
    );
    grpc::serve(
        Arc::clone(&hub),
        grpc_listener,
        server_tls,
        shutdown_signal(),
    )
    .await?;
    // NB: stop the election loop first, or it could renew the lease we are releasing.
    drop(running);
    if let Some(cfg) = lease {
        leader::release(client, &cfg).await;
    }
    tracing::info!("shut down");
    Ok(())
}
