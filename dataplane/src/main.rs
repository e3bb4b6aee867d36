//! `sluice-dataplane`: parses flags and wires the dataplane library together.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use sluice_dataplane::config::controller_client::{self, Backoff, ClientConfig, ClientTls};
use sluice_dataplane::config::{standalone, store::Store};
use sluice_dataplane::listener::proxy_protocol::ProxyProtocol;
use sluice_dataplane::listener::{admin, gateway, server, tls};
use sluice_dataplane::upstream::PoolConfig;
use sluice_io::allocator::no_transparent_huge_pages;
// Returns memory freed by this thread to the OS: mimalloc's, or glibc's with
// `--features system-allocator`.
#[cfg(not(feature = "system-allocator"))]
use sluice_io::allocator::trim_heap;
#[cfg(feature = "system-allocator")]
use sluice_io::allocator::trim_system_heap as trim_heap;
use sluice_io::wbatch;
use sluice_process::{LogFormat, init_logs, shutdown_signal};

/// mimalloc, unless built with `--features system-allocator`: glibc's malloc, which heap
/// profilers (heaptrack, massif) can see (`bench/idle-heap.sh`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: sluice_io::allocator::Mimalloc = sluice_io::allocator::Mimalloc;

/// `--stream-ports` (clap takes a `Vec` field as a repeated flag; this is one value).
type StreamPorts = Vec<sluice_translate::StreamPort>;

/// Sluice dataplane: proxies HTTP traffic by the routes of a snapshot, taken from YAML files
/// (standalone mode) or from the Sluice controller.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Standalone mode: a YAML file or directory with ApisixRoute, ApisixUpstream, Service,
    /// EndpointSlice and Secret documents, as for `kubectl apply`. Reloaded on change.
    #[arg(long, value_name = "PATH", conflicts_with = "controller")]
    standalone: Option<PathBuf>,
    /// Standalone mode: the layer-4 ports for ApisixRoute `spec.stream` rules, as the
    /// controller's flag of the same name: `tcp:9100,udp:9200,tls:9443` (`tls:` ports
    /// terminate TLS by SNI with the ApisixTls certificates). A rule on another port is
    /// refused. In controller mode the controller declares them. Default: none.
    #[arg(long, value_name = "PROTO:PORT,...", default_value = "", requires = "standalone", value_parser = sluice_translate::parse_stream_ports)]
    stream_ports: StreamPorts,
    /// Standalone: serve Ingresses of these classes (comma-separated or repeated) as
    /// ingress-nginx would, honouring their `nginx.ingress.kubernetes.io/*` annotations
    /// (docs/ingress-nginx.md). Default: none.
    #[arg(
        long,
        value_name = "NAME",
        value_delimiter = ',',
        requires = "standalone"
    )]
    ingress_nginx_class: Vec<String>,
    /// Standalone: a setting of ingress-nginx's ConfigMap for those classes (repeatable;
    /// see the controller's flag of the same name).
    #[arg(long, value_name = "KEY=VALUE", requires = "standalone", value_parser = sluice_translate::nginx::parse_config)]
    ingress_nginx_config: Vec<(String, String)>,
    /// Controller mode: the gRPC URL of sluice-controller, e.g.
    /// `https://sluice-controller.sluice.svc:18000`. Needs --tls-cert, --tls-key and
    /// --tls-ca, or --insecure for a controller on localhost. Several controller replicas
    /// may be listed separated by commas; each redial tries the next.
    #[arg(long, value_name = "URL")]
    controller: Option<String>,
    /// Controller mode: PEM certificate chain this dataplane presents to the controller.
    #[arg(long, value_name = "FILE", requires_all = ["controller", "tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// Controller mode: PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires_all = ["controller", "tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// Controller mode: PEM CA bundle the controller's certificate must chain to.
    #[arg(long, value_name = "FILE", requires_all = ["controller", "tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// Controller mode: name to verify the controller's certificate against (default: the
    /// host of --controller).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// Controller mode: plaintext to the controller. Refused unless --controller is a
    /// loopback address (snapshots carry TLS keys).
    #[arg(long, requires = "controller", conflicts_with_all = ["tls_cert", "tls_key", "tls_ca"])]
    insecure: bool,
    /// Controller mode: directory where the last good snapshot is kept (`snapshot.pb`) and
    /// served from at start, so a restart serves without a controller. Default: not kept.
    #[arg(long, value_name = "DIR", requires = "controller")]
    state_dir: Option<PathBuf>,
    /// Controller mode: this dataplane's name in the controller's bookkeeping and status.
    /// Default: $POD_NAME, else $HOSTNAME, else `sluice-dataplane`.
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    dataplane_id: Option<String>,
    /// Plain-HTTP listener (HTTP/1.1 and h2c).
    #[arg(long, default_value = "0.0.0.0:9080")]
    listen_http: SocketAddr,
    /// HTTPS listener: terminates TLS with the certificates of the snapshot (ApisixTls,
    /// Ingress spec.tls), chosen by SNI; ALPN h2 and http/1.1.
    #[arg(long, default_value = "0.0.0.0:9443")]
    listen_https: SocketAddr,
    /// Standalone mode: the kubernetes.io/tls Secret (NAMESPACE/NAME, a document in the
    /// files) served to TLS handshakes without SNI or for a host no certificate covers, as
    /// ingress-nginx's flag of the same name. Default: such handshakes are refused. (With
    /// --controller, the controller's flag of the same name sets it.)
    #[arg(long, value_name = "NS/NAME", value_parser = secret_ref)]
    default_ssl_certificate: Option<(String, String)>,
    /// Standalone mode: a TLS handshake without SNI gets the certificate of this host
    /// (APISIX `apisix.ssl.fallback_sni`), before the default certificate.
    #[arg(long, value_name = "HOST", value_parser = fallback_sni)]
    fallback_sni: Option<String>,
    /// Admin listener: /healthz, /readyz, /metrics and the debug endpoint /snapshot (keys and
    /// credentials redacted). Keep it on loopback unless you mean to expose it.
    #[arg(long, default_value = "127.0.0.1:9091")]
    admin: SocketAddr,
    /// Status listener: /healthz, /readyz and /metrics only, for kubelet probes and
    /// Prometheus on the pod's address (e.g. 0.0.0.0:9090). Default: none.
    #[arg(long, value_name = "ADDR")]
    status: Option<SocketAddr>,
    /// Worker threads; each has its own runtime and listener. Default: number of CPUs.
    #[arg(long)]
    workers: Option<usize>,
    /// Most open downstream connections per worker.
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
    /// Time a client may take to send a request head (HTTP/1.1, also while a keep-alive
    /// connection waits for its next request) or its first HTTP/2 request, preface included.
    #[arg(long, default_value = "30s", value_parser = duration)]
    header_timeout: Duration,
    /// How long an HTTP/2 connection may stay without a request in flight (nginx
    /// `keepalive_timeout`).
    #[arg(long, default_value = "60s", value_parser = duration)]
    idle_timeout: Duration,
    /// Stream (TCP, TLS, UDP) ports: how long the connections of a stream route that a
    /// snapshot removed (or of a port being closed) go on before they are closed.
    #[arg(long, default_value = "60s", value_parser = duration)]
    stream_drain_timeout: Duration,
    /// TLS stream ports: time a client has to send its ClientHello (and, for routes that
    /// terminate TLS, to finish the handshake).
    #[arg(long, default_value = "10s", value_parser = duration)]
    client_hello_timeout: Duration,
    /// UDP stream ports: most sessions per worker and port (each holds a socket); a
    /// datagram that would open one more is dropped. A client IP may hold at most 256.
    #[arg(long, default_value_t = 10_000)]
    udp_max_sessions: usize,
    /// Longest pause between two pieces of a request body (nginx `client_body_timeout`);
    /// past it the request is answered 408. The upstream read timeout (the route's
    /// `timeout.read`) bounds the pause between two pieces of a response body the same way.
    #[arg(long, default_value = "60s", value_parser = duration)]
    client_body_timeout: Duration,
    /// Longest a write to a client may wait for the client to read (nginx `send_timeout`);
    /// past it the connection is closed.
    #[arg(long, default_value = "60s", value_parser = duration)]
    send_timeout: Duration,
    /// Plugins this dataplane runs (comma-separated), like APISIX's `plugins:` list; a
    /// snapshot with a route using any other plugin is rejected and the last good one keeps
    /// serving. Default: every built-in plugin.
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    plugins: Option<Vec<String>>,
    /// Plugin metadata, APISIX's `plugin_metadata`: a YAML or JSON file mapping a plugin
    /// name to its process-wide settings, e.g. `opentelemetry: {collector: {address:
    /// "otel-collector:4318"}}` (docs/plugins.md). Read once at start; a bad file stops the
    /// dataplane with the plugin and field named. Default: the plugins' default metadata.
    #[arg(long, value_name = "FILE", env = "SLUICE_PLUGIN_METADATA")]
    plugin_metadata: Option<PathBuf>,
    /// Directory file-logger may write into (repeatable); a route's file-logger `path`
    /// elsewhere (except /dev/stdout and /dev/stderr) is refused, so that no route can
    /// overwrite the state directory or fill another volume.
    #[arg(long, value_name = "DIR", default_value = "/var/log/sluice")]
    file_logger_dir: Vec<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// On SIGTERM/SIGINT: how long in-flight requests and upgraded WebSocket sessions may take
    /// to finish after the listeners close (idle connections close at once); whatever is
    /// still open then is closed, and the process exits 0.
    #[arg(long, default_value = "30s", value_parser = duration)]
    drain_timeout: Duration,
    /// On SIGTERM/SIGINT: how long to keep accepting and serving before the drain starts,
    /// while /readyz answers 503 and load balancers (kube-proxy, a cloud LB) stop sending new
    /// connections here. Meanwhile each HTTP/1.1 response carries `Connection: close` and each
    /// HTTP/2 connection gets a GOAWAY, so clients reconnect elsewhere. A second signal
    /// ends the delay. Like ingress-nginx's wait-shutdown; the chart sets 5s.
    #[arg(long, default_value = "0s", value_parser = duration)]
    shutdown_delay: Duration,
    /// Most idle keep-alive connections kept per upstream endpoint and worker (APISIX
    /// `keepalive_pool.size`).
    #[arg(long, default_value_t = 320)]
    upstream_keepalive_pool_size: usize,
    /// How long an idle upstream keep-alive connection is kept (APISIX
    /// `keepalive_pool.idle_timeout`).
    #[arg(long, default_value = "50s", value_parser = duration)]
    upstream_keepalive_idle_timeout: Duration,
    /// Requests per upstream connection before it is closed; 0 = unlimited (APISIX
    /// `keepalive_pool.requests`).
    #[arg(long, default_value_t = 1000)]
    upstream_keepalive_requests: u32,
    /// How often host-name endpoints (externalNodes of type Domain, ExternalName Services)
    /// are resolved again, in the background.
    #[arg(long, default_value = "30s", value_parser = duration)]
    upstream_dns_refresh: Duration,
    /// Send the small writes (responses, upstream requests) that a worker makes during one
    /// turn of its event loop together when the turn ends: `auto` in one io_uring
    /// submission (one send(2) each when io_uring is refused, e.g. by a seccomp profile),
    /// `send` always one send(2) each, `off` every write at once. Fewer system calls and
    /// fewer preemptions per request; see docs/performance.md. Applies to the HTTP and
    /// HTTPS listeners and to HTTP/1.1 upstream connections.
    #[arg(long, value_enum, default_value = "auto")]
    write_batching: WriteBatching,
    /// PROXY protocol v1/v2 on --listen-http, --listen-https and the controller's
    /// --stream-ports TCP/TLS ports, the ports of the dataplane Service (as ingress-nginx's
    /// `use-proxy-protocol`): every connection must start with a PROXY header, which a
    /// load balancer in front (AWS NLB, HAProxy) writes; the client address it carries is
    /// the one X-Forwarded-For, real-ip, ip-restriction, limit-* and the logs see. A
    /// connection without a valid header is closed. Per-Gateway ports follow their Gateway
    /// listener's setting instead.
    #[arg(long)]
    proxy_protocol: bool,
    /// With --proxy-protocol: the addresses or CIDRs (comma-separated) of the peers allowed
    /// to send a PROXY header, i.e. the load balancers; a connection from any other peer is
    /// closed. Default: any peer.
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', value_parser = cidr, requires = "proxy_protocol")]
    proxy_protocol_trusted: Vec<ipnet::IpNet>,
    /// Time a load balancer has to send a whole PROXY header (HTTP, HTTPS and stream
    /// listeners that require one); past it the connection is closed.
    #[arg(long, default_value = "5s", value_parser = duration)]
    proxy_header_timeout: Duration,
}

fn cidr(raw: &str) -> Result<ipnet::IpNet, String> {
    raw.parse::<ipnet::IpNet>()
        .or_else(|_| raw.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{raw:?} is not an IP address or CIDR"))
}

fn secret_ref(raw: &str) -> Result<(String, String), String> {
    sluice_translate::parse_secret_ref(raw)
}

fn fallback_sni(raw: &str) -> Result<String, String> {
    sluice_translate::parse_fallback_sni(raw)
}

fn duration(raw: &str) -> Result<Duration, String> {
    sluice_crds::parse_duration(raw).map_err(|e| e.to_string())
}

/// `--write-batching`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum WriteBatching {
    Auto,
    Send,
    Off,
}

/// Where the configuration comes from.
enum Source {
    Standalone(PathBuf),
    Controller(Box<ClientConfig>),
}

fn source(args: &Args) -> anyhow::Result<Source> {
    if let Some(path) = &args.standalone {
        return Ok(Source::Standalone(path.clone()));
    }
    if args.default_ssl_certificate.is_some() || args.fallback_sni.is_some() {
        // NB: in controller mode the snapshot carries these; the controller's flags set them.
        anyhow::bail!(
            "--default-ssl-certificate and --fallback-sni are standalone-mode flags; with \
             --controller, give them to sluice-controller"
        );
    }
    let Some(url) = args.controller.clone() else {
        anyhow::bail!("give --standalone PATH or --controller URL");
    };
    let tls = match (&args.tls_ca, &args.tls_cert, &args.tls_key) {
        (Some(ca), Some(cert), Some(key)) => Some(ClientTls::from_files(
            ca,
            cert,
            key,
            args.tls_server_name.clone(),
        )?),
        _ if args.insecure => None,
        _ => return Err(controller_client::ClientError::TlsMissing.into()),
    };
    let dataplane_id = args
        .dataplane_id
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sluice-dataplane".to_owned());
    let config = ClientConfig {
        url,
        tls,
        dataplane_id,
        state_dir: args.state_dir.clone(),
        backoff: Backoff::default(),
    };
    config.validate()?;
    Ok(Source::Controller(Box::new(config)))
}

fn main() -> anyhow::Result<()> {
    // Before anything else allocates much: a huge page taken now would stay.
    let thp = no_transparent_huge_pages();
    let args = Args::parse();
    init_logs(args.log_format);
    if let Err(error) = thp {
        tracing::warn!(%error, "transparent huge pages stay on: prctl(PR_SET_THP_DISABLE) failed");
    }
    let source = source(&args)?;
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let store = Arc::new(Store::with_pool_config(PoolConfig {
        max_idle: args.upstream_keepalive_pool_size,
        idle_timeout: args.upstream_keepalive_idle_timeout,
        max_requests: args.upstream_keepalive_requests,
        dns_refresh: args.upstream_dns_refresh,
    })?);
    if let Some(names) = &args.plugins {
        let known: Vec<&str> = sluice_dataplane::plugins::BUILTINS
            .iter()
            .map(|r| r.name)
            .collect();
        if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
            anyhow::bail!(
                "--plugins: unknown plugin {bad:?} (known: {})",
                known.join(", ")
            );
        }
    }
    store.plugin_state().set_enabled(args.plugins.clone());
    if let Some(bad) = args.file_logger_dir.iter().find(|d| !d.is_absolute()) {
        anyhow::bail!("--file-logger-dir: {} is not absolute", bad.display());
    }
    store
        .plugin_state()
        .set_file_log_dirs(Some(args.file_logger_dir.clone()));
    if let Some(path) = &args.plugin_metadata {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --plugin-metadata {}", path.display()))?;
        let metadata = sluice_dataplane::plugins::PluginMetadata::parse(&text)
            .with_context(|| format!("--plugin-metadata {}", path.display()))?;
        store.plugin_state().set_metadata(metadata);
    }

    // One small runtime for the admin listener and the configuration source.
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let admin_listener = control
        .block_on(tokio::net::TcpListener::bind(args.admin))
        .with_context(|| format!("binding admin listener {}", args.admin))?;
    let status_listener = match args.status {
        Some(addr) => Some(
            control
                .block_on(tokio::net::TcpListener::bind(addr))
                .with_context(|| format!("binding status listener {addr}"))?,
        ),
        None => None,
    };

    // Serve the first configuration before opening the traffic port: the files, or the
    // snapshot persisted by the last run in controller mode.
    let mut version = 1;
    let standalone_options = sluice_translate::Options {
        default_certificate: args.default_ssl_certificate.clone(),
        fallback_sni: args.fallback_sni.clone(),
        stream_ports: args.stream_ports.clone(),
        nginx_classes: args.ingress_nginx_class.clone(),
        nginx_config: args.ingress_nginx_config.iter().cloned().collect(),
        ..Default::default()
    };
    let mut recheck_at = None;
    match &source {
        Source::Standalone(path) => {
            recheck_at = standalone::reload_with(path, &store, &mut version, &standalone_options)
                .certificates_change_at;
        }
        Source::Controller(config) => {
            if let Some(dir) = &config.state_dir
                && let Err(e) = controller_client::restore(&store, dir)
            {
                tracing::warn!(error = %e, "persisted snapshot not served; waiting for the controller");
            }
        }
    }
    trim_heap();

    let limits = server::Limits {
        max_connections: args.max_connections,
        header_read_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        client_body_timeout: args.client_body_timeout,
        send_timeout: args.send_timeout,
        proxy_header_timeout: args.proxy_header_timeout,
        ..Default::default()
    };
    let proxy_protocol = args.proxy_protocol.then(|| ProxyProtocol {
        trusted: args.proxy_protocol_trusted.clone(),
    });
    wbatch::set_policy(match args.write_batching {
        WriteBatching::Auto => wbatch::Policy::Auto,
        WriteBatching::Send => wbatch::Policy::Send,
        WriteBatching::Off => wbatch::Policy::Off,
    });
    server::set_idle_trim(trim_heap);
    let (drain_trigger, drain) = server::Drain::channel();
    let gateway_listeners = Arc::new(std::sync::Mutex::new(
        gateway::GatewayListeners::new(args.listen_http.ip(), workers, Arc::clone(&store), limits)
            .with_stream_limits(sluice_dataplane::stream::StreamLimits {
                max_connections: args.max_connections,
                client_hello_timeout: args.client_hello_timeout,
                drain_timeout: args.stream_drain_timeout,
                udp_max_sessions: args.udp_max_sessions,
                proxy_header_timeout: args.proxy_header_timeout,
                ..Default::default()
            })
            .with_fleet_proxy_protocol(proxy_protocol.clone()),
    ));
    let gateway_drain = drain.clone();
    let mut handles = server::spawn_workers_until(
        args.listen_http,
        workers,
        Arc::clone(&store),
        limits,
        drain.clone(),
        proxy_protocol.clone(),
    )
    .with_context(|| format!("binding {}", args.listen_http))?;
    handles.extend(
        tls::spawn_https_workers(
            args.listen_https,
            workers,
            Arc::clone(&store),
            limits,
            drain,
            proxy_protocol,
        )
        .with_context(|| format!("binding {}", args.listen_https))?,
    );
    let source_name = match &source {
        Source::Standalone(path) => path.display().to_string(),
        Source::Controller(config) => config.url.clone(),
    };
    tracing::info!(http = %args.listen_http, https = %args.listen_https, admin = %args.admin, status = ?args.status, workers, source = %source_name, "sluice-dataplane serving");

    control.block_on(async move {
        tokio::spawn(gateway::run(
            Arc::clone(&gateway_listeners),
            Arc::clone(&store),
            gateway_drain,
        ));
        tokio::spawn(admin::serve(
            admin_listener,
            Arc::clone(&store),
            admin::Endpoints::All,
        ));
        if let Some(listener) = status_listener {
            tokio::spawn(admin::serve(
                listener,
                Arc::clone(&store),
                admin::Endpoints::Status,
            ));
        }
        match source {
            Source::Standalone(path) => {
                tokio::spawn(standalone::watch_with(
                    path,
                    Arc::clone(&store),
                    version,
                    trim_heap,
                    standalone_options,
                    recheck_at,
                ));
            }
            Source::Controller(config) => {
                tokio::spawn(controller_client::run(
                    *config,
                    Arc::clone(&store),
                    trim_heap,
                ));
            }
        }
        shutdown_signal().await;
        store.start_draining();
        // NB: the Endpoints controller and kube-proxy take a second or two to stop sending
        // connections to a pod that is terminating; until then its listeners must accept,
        // or those connections are refused (or hang on a vanished pod IP).
        if !args.shutdown_delay.is_zero() {
            tracing::info!(
                delay = ?args.shutdown_delay,
                "shutting down: /readyz answers 503; still serving, with each connection \
                 closed after its response, until the delay ends"
            );
            drain_trigger.go_away();
            tokio::select! {
                _ = tokio::time::sleep(args.shutdown_delay) => {}
                _ = shutdown_signal() => {
                    tracing::info!("second signal: the rest of the shutdown delay is skipped");
                }
            }
        }
        // Graceful drain: listeners close, in-flight requests and upgraded WebSocket
        // sessions finish (up to --drain-timeout, then they are cut), idle connections close.
        tracing::info!(timeout = ?args.drain_timeout, "draining");
        drain_trigger.drain();
        let deadline = tokio::time::Instant::now() + args.drain_timeout;
        let gateway_done = || match gateway_listeners.lock() {
            Ok(g) => g.finished(),
            Err(p) => p.into_inner().finished(),
        };
        while !(handles.iter().all(|h| h.is_finished()) && gateway_done()) {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    "drain timeout reached; exiting with requests or WebSocket sessions still open"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The logger plugins send what the served requests left in their queues (at least
        // a second for it, past the drain timeout if need be).
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_secs(1));
        if !sluice_dataplane::plugins::support::batch::flush_all(left).await {
            tracing::warn!("access-log entries still unsent at exit");
        }
    });
    tracing::info!("shut down");
    Ok(())
}
