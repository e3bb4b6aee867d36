#!/usr/bin/env python3
"""Draws the Grafana dashboard charts/sluice/dashboards/sluice-apisix.json (the panels and
queries of APISIX's dashboard grafana.com 11719) from a real Prometheus scrape of a real
standalone dataplane under load. Run through scripts/generate/dashboard-render.sh, which builds the
binaries and the matplotlib venv.

What runs, all on 127.0.0.1 and stopped at the end:
  - sluice-echo, the backend (`/status/<code>` answers that status, `/delay/<ms>` waits);
  - sluice-dataplane --standalone on a directory: three ApisixRoute rules with the
    prometheus plugin (one with key-auth and an ApisixConsumer, for the consumer label);
  - Prometheus scraping the dataplane's /metrics every SCRAPE seconds;
  - wrk in phases of different concurrency, with 4xx/5xx, slow and authenticated requests,
    and one configuration change half-way (a route edit: the modify-index stand-in moves).

Then every panel's queries go to Prometheus's /api/v1/query_range with the dashboard's
variables set as Grafana sets them with every variable at "All" (`.*`), the data source's
scrape interval set to SCRAPE, and STEP as `$__interval`:
  $__rate_interval = max($__interval + scrape interval, 4 * scrape interval)
The panels are drawn where their gridPos puts them, with their titles and legends.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SCRAPE = 2  # seconds, Prometheus scrape interval and the data source's
STEP = 2  # seconds, $__interval and the query_range step
RATE_INTERVAL = max(STEP + SCRAPE, 4 * SCRAPE)
API_KEY = "render-demo-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, what, timeout=30, ok=lambda body: True):
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                body = r.read().decode()
                if ok(body):
                    return body
        except OSError:
            pass
        if time.time() > deadline:
            sys.exit(f"dashboard-render: {what} did not come up ({url})")
        time.sleep(0.2)


def backend_yaml(port):
    return f"""apiVersion: v1
kind: Service
metadata: {{name: shop, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: shop-1
  namespace: default
  labels: {{kubernetes.io/service-name: shop}}
addressType: IPv4
endpoints:
  - addresses: ["127.0.0.1"]
    conditions: {{ready: true}}
ports: [{{name: http, port: {port}}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixConsumer
metadata: {{name: mobile-app, namespace: default}}
spec:
  authParameter:
    keyAuth:
      value: {{key: {API_KEY}}}
"""


def routes_yaml(api_paths):
    paths = ", ".join(f'"{p}"' for p in api_paths)
    rule = """    - name: {name}
      match:
        paths: [{paths}]
      backends:
        - serviceName: shop
          servicePort: 80
{auth}      plugins:
        - name: prometheus
          enable: true
"""
    auth = "      authentication: {enable: true, type: keyAuth}\n"
    return (
        "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\n"
        "metadata: {name: shop, namespace: default}\nspec:\n  http:\n"
        + rule.format(name="api", paths=paths + ', "/status/*", "/delay/*"', auth="")
        + rule.format(name="static", paths='"/static/*"', auth="")
        + rule.format(name="account", paths='"/account/*"', auth=auth)
    )


WRK_LUA = """
local paths = {
  "/api/items", "/api/items", "/api/items", "/api/items/42", "/api/items/7",
  "/static/app.js", "/static/app.css", "/static/logo.svg",
  "/status/404", "/status/500", "/status/503", "/delay/20",
  "/account/orders", "/account/profile", "/nowhere",
}
local i = 0
request = function()
  i = i + 1
  local p = paths[(i % #paths) + 1]
  if p:sub(1, 9) == "/account/" then
    return wrk.format("GET", p, { ["apikey"] = "API_KEY" })
  end
  return wrk.format("GET", p)
end
""".replace("API_KEY", API_KEY)


class Stack:
    """The processes of one run; all stopped by stop()."""

    def __init__(self):
        self.procs = []

    def start(self, name, args, log_dir):
        log = open(os.path.join(log_dir, f"{name}.log"), "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, p))
        return p

    def stop(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def query_range(prom, expr, start, end):
    q = urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": STEP}
    )
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        raise RuntimeError(f"{expr}: {doc}")
    return doc["data"]["result"]


def substitute(expr):
    """The dashboard's variables as Grafana sets them with every variable at "All"."""
    expr = expr.replace("$__rate_interval", f"{RATE_INTERVAL}s")
    expr = expr.replace("$__interval", f"{STEP}s")
    return re.sub(r"\$(service|route|instance|consumer|node)\b", ".*", expr)


def legend(fmt, metric):
    if not fmt:
        return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(metric.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def run_load(args, http, dp_admin, conf_dir, log_dir):
    lua = os.path.join(log_dir, "mix.lua")
    with open(lua, "w") as f:
        f.write(WRK_LUA)
    total = args.load_seconds
    # (share of the time, connections): a ramp up, a peak, and a quiet tail.
    phases = [(0.25, 8), (0.35, 32), (0.15, 4), (0.25, 16)]
    summary = []
    for n, (share, conns) in enumerate(phases):
        secs = max(5, int(total * share))
        if n == 2:
            # A configuration change: one route edited (the modify-index stand-in moves).
            with open(os.path.join(conf_dir, "routes.yaml"), "w") as f:
                f.write(routes_yaml(["/api/*", "/v2/api/*"]))
        out = subprocess.run(
            ["wrk", "-t2", f"-c{conns}", f"-d{secs}s", "-s", lua, f"http://{http}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rps = re.search(r"Requests/sec:\s*([\d.]+)", out)
        summary.append(f"{secs}s at {conns} connections: {rps.group(1) if rps else '?'} req/s")
        print(f"dashboard-render: load phase {n + 1}: {summary[-1]}", file=sys.stderr)
    return summary


def draw(dash, results, out, window):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    bg, panel_bg, fg, grid = "#111217", "#181b1f", "#ccccdc", "#2c3235"
    colors = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2",
              "#b877d9", "#705da0", "#37872d", "#fade2a"]
    panels = []
    for p in dash["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_h = 0.42  # inches per Grafana grid row
    fig = plt.figure(figsize=(24, rows * unit_h + 1.2), facecolor=bg)
    gs = GridSpec(rows, 24, figure=fig, left=0.02, right=0.99, top=1 - 1.0 / (rows * unit_h + 1.2),
                  bottom=0.01, hspace=2.6, wspace=1.2)
    fig.suptitle(
        f"{dash['title']}: rendered by a plotting tool (matplotlib) from a real Prometheus "
        f"scrape of a loaded Sluice dataplane; last {window // 60} min, all variables = All",
        color=fg, fontsize=15, x=0.01, ha="left")
    t0 = None
    for p in panels:
        g = p["gridPos"]
        if p["type"] == "row":
            ax = fig.add_subplot(gs[g["y"]:g["y"] + 1, 0:24])
            ax.set_axis_off()
            ax.text(0, 0.2, p["title"], color=fg, fontsize=14, fontweight="bold",
                    transform=ax.transAxes)
            continue
        ax = fig.add_subplot(gs[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        ax.set_facecolor(panel_bg)
        for s in ax.spines.values():
            s.set_color(grid)
        ax.tick_params(colors=fg, labelsize=8)
        ax.set_title(p["title"], color=fg, fontsize=11, loc="left")
        series = results[p["id"]]
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        if not series:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, "No data", color="#8e8e8e", fontsize=16, ha="center",
                    va="center", transform=ax.transAxes)
            continue
        if p["type"] == "stat":
            name, xs, ys = series[0]
            if t0 is None and xs:
                t0 = xs[0]
            ax.fill_between([x - xs[0] for x in xs], ys, color="#73bf69", alpha=0.15)
            ax.plot([x - xs[0] for x in xs], ys, color="#73bf69", linewidth=1)
            ax.set_xticks([])
            ax.set_yticks([])
            v = ys[-1]
            ax.text(0.5, 0.45, f"{v:,.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.2f}",
                    color="#73bf69", fontsize=26, fontweight="bold", ha="center",
                    va="center", transform=ax.transAxes)
            continue
        for i, (name, xs, ys) in enumerate(series):
            base = xs[0] if t0 is None else t0
            ax.plot([(x - base) / 60 for x in xs], ys, color=colors[i % len(colors)],
                    linewidth=1.2, label=name)
        ax.grid(color=grid, linewidth=0.5)
        ax.set_xlabel("minutes", color=fg, fontsize=8)
        ax.set_ylabel({"Bps": "bytes/s", "reqps": "req/s", "ms": "ms",
                       "percent": "%"}.get(unit, ""), color=fg, fontsize=8)
        leg = ax.legend(fontsize=7, loc="upper left", facecolor=panel_bg, edgecolor=grid,
                        labelcolor=fg, ncol=min(4, len(series)))
        leg.get_frame().set_alpha(0.8)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=60, facecolor=bg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataplane", required=True)
    ap.add_argument("--echo", required=True)
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--load-seconds", type=int, default=120)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.dashboard) as f:
        dash = json.load(f)

    work = tempfile.mkdtemp(prefix="sluice-dashboard-")
    conf_dir = os.path.join(work, "conf")
    os.makedirs(conf_dir)
    stack = Stack()
    try:
        echo_port, http, admin, prom_port = (free_port() for _ in range(4))
        stack.start("echo", [args.echo, "--listen", f"127.0.0.1:{echo_port}",
                             "--name", "shop"], work)
        with open(os.path.join(conf_dir, "backend.yaml"), "w") as f:
            f.write(backend_yaml(echo_port))
        with open(os.path.join(conf_dir, "routes.yaml"), "w") as f:
            f.write(routes_yaml(["/api/*"]))
        stack.start("dataplane", [args.dataplane, "--standalone", conf_dir,
                                  "--listen-http", f"127.0.0.1:{http}",
                                  "--listen-https", "127.0.0.1:0",
                                  "--admin", f"127.0.0.1:{admin}", "--workers", "2"], work)
        wait_http(f"http://127.0.0.1:{admin}/snapshot", "the dataplane",
                  ok=lambda b: json.loads(b).get("routes", 0) >= 3)
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            f.write(f"""global:
  scrape_interval: {SCRAPE}s
  evaluation_interval: {SCRAPE}s
scrape_configs:
  - job_name: sluice-dataplane
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:{admin}"]
""")
        stack.start("prometheus", [args.prometheus,
                                   f"--config.file={work}/prometheus.yml",
                                   f"--storage.tsdb.path={work}/tsdb",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"], work)
        prom = f"http://127.0.0.1:{prom_port}"
        wait_http(f"{prom}/-/ready", "Prometheus")
        wait_http(f"{prom}/api/v1/query?query=up", "the first scrape",
                  ok=lambda b: '"value"' in b and '"1"]' in b)
        start = time.time()
        time.sleep(3 * SCRAPE)
        summary = run_load(args, f"127.0.0.1:{http}", admin, conf_dir, work)
        time.sleep(3 * SCRAPE)  # the tail of the load reaches a scrape or two
        end = time.time()

        results, empty = {}, []
        for p in dash["panels"]:
            if p["type"] == "row":
                continue
            series = []
            for t in p.get("targets", []):
                for r in query_range(prom, substitute(t["expr"]), start, end):
                    xs = [float(v[0]) for v in r["values"]]
                    ys = [float(v[1]) for v in r["values"]]
                    series.append((legend(t.get("legendFormat", ""), r["metric"]), xs, ys))
            results[p["id"]] = series
            if not series:
                empty.append(p["title"])
        draw(dash, results, args.out, int(end - start))
        print(f"dashboard-render: wrote {args.out}", file=sys.stderr)
        print("dashboard-render: load: " + "; ".join(summary), file=sys.stderr)
        print(f"dashboard-render: $__rate_interval={RATE_INTERVAL}s step={STEP}s "
              f"scrape={SCRAPE}s", file=sys.stderr)
        print("dashboard-render: panels with no data: " + (", ".join(empty) or "none"),
              file=sys.stderr)
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
