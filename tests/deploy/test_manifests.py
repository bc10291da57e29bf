"""deploy/: every kustomization renders and validates offline; the workload matches the server."""
import copy
import functools
import json
import os
import shutil
import subprocess

import pytest
import yaml

import deploy_checks as dc
from certs import make_certs
from deploy_checks import health, scrape
from server_process import Server

METRICS_PATH = "/metrics"


def facts(server):
    """What the running server serves, as check_server_workload takes it."""
    return dict(health_serving=functools.lru_cache(lambda service: health(server.address, service)),
                metric_names=dc.metric_families(server.metrics_text), metrics_path=METRICS_PATH)


@pytest.mark.parametrize("kustomization", dc.KUSTOMIZATIONS)
def test_renders_and_validates(kustomization):
    objects = dc.render(kustomization)
    assert objects
    for obj in objects:
        dc.validate(obj)


def test_validation_is_strict():
    """A misspelt field or a port of the wrong type is refused, for core kinds and for CRDs."""
    objects = dc.render("overlays/cpu")
    deployment = copy.deepcopy(dc.one(objects, "Deployment", "praxis-serve"))
    dc.server_container(deployment)["readinessProbes"] = {}
    with pytest.raises(Exception):
        dc.validate(deployment)
    service = copy.deepcopy(dc.one(objects, "Service", "praxis-serve"))
    service["spec"]["ports"][0]["port"] = "fifty"
    with pytest.raises(Exception):
        dc.validate(service)
    monitor = copy.deepcopy(dc.one(objects, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["paht"] = "/metrics"
    with pytest.raises(Exception):
        dc.validate(monitor)


@pytest.mark.parametrize("overlay", dc.OVERLAYS)
def test_workload_matches_the_server(overlay, help_flags, cpu_server):
    problems = dc.check_server_workload(dc.render(overlay), help_flags, **facts(cpu_server))
    assert problems == []


def test_cpu_overlay_flags_start_the_server(cpu_server):
    """The cpu overlay's flagfiles, as mounted, are accepted: the server warmed up and serves."""
    assert health(cpu_server.address, "praxis.v1.Praxis")
    assert 'praxis_model_info{' in cpu_server.metrics_text
    assert 'device="cpu"' in cpu_server.metrics_text


def mutations():
    """Each breaks one thing the checker must catch: (what, how)."""
    def container(objects):
        return dc.server_container(dc.one(objects, "Deployment", "praxis-serve"))

    def service(objects, name="praxis-serve"):
        return dc.one(objects, "Service", name)

    def flags(objects, text):
        cm = dc.by_kind(objects, "ConfigMap")[0]
        cm["data"]["server.flags"] += text

    return [
        ("grpc containerPort", lambda o: container(o)["ports"][0].update(containerPort=50052)),
        ("metrics containerPort", lambda o: container(o)["ports"][1].update(containerPort=9091)),
        ("readiness probe port", lambda o: container(o)["readinessProbe"]["grpc"].update(port=8080)),
        ("liveness probe service",
         lambda o: container(o)["livenessProbe"]["grpc"].update(service="praxis.v1.Praxi")),
        ("startup probe as tcp",
         lambda o: container(o).update(startupProbe={"tcpSocket": {"port": 50051}})),
        ("short startup", lambda o: container(o)["startupProbe"].update(failureThreshold=10)),
        ("grace shorter than the drain",
         lambda o: o[[x["kind"] for x in o].index("Deployment")]["spec"]["template"]["spec"]
         .update(terminationGracePeriodSeconds=30)),
        ("no preStop", lambda o: container(o).pop("lifecycle")),
        ("port moved in the flagfile only", lambda o: flags(o, "--port=6000\n")),
        ("unknown flag", lambda o: flags(o, "--max_batch=8\n")),
        ("Service targetPort", lambda o: service(o)["spec"]["ports"][0].update(targetPort="gprc")),
        ("Service selector", lambda o: service(o)["spec"].update(selector={"app": "other"})),
        ("headless not headless",
         lambda o: service(o, "praxis-serve-headless")["spec"].pop("clusterIP")),
        ("ServiceMonitor port",
         lambda o: dc.one(o, "ServiceMonitor")["spec"]["endpoints"][0].update(port="grpc")),
        ("ServiceMonitor path",
         lambda o: dc.one(o, "ServiceMonitor")["spec"]["endpoints"][0].update(path="/metric")),
        ("HPA metric",
         lambda o: dc.one(o, "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["metric"]
         .update(name="praxis_queue_length")),
    ]


@pytest.mark.parametrize("what,mutate", mutations(), ids=[m[0] for m in mutations()])
def test_a_wrong_port_or_probe_fails(what, mutate, help_flags, cpu_server):
    objects = dc.render("overlays/cpu")
    mutate(objects)
    assert dc.check_server_workload(objects, help_flags, **facts(cpu_server)), what


def test_monitoring_names_are_served(cpu_server):
    """The adapter rule, the HPA and every dashboard query name metrics the server exposes."""
    served = dc.metric_families(cpu_server.metrics_text) | dc.CUDA_ONLY_METRICS
    objects = dc.render("monitoring")
    rules = yaml.safe_load(dc.one(objects, "ConfigMap", "prometheus-adapter")["data"]["config.yaml"])
    adapter = dc.metric_references(json.dumps(rules))
    hpa = {m["pods"]["metric"]["name"]
           for m in dc.one(dc.render("base"), "HorizontalPodAutoscaler")["spec"]["metrics"]}
    assert hpa <= adapter, "the HPA reads a metric the adapter does not serve"
    dashboard = json.loads(dc.one(objects, "ConfigMap", "praxis-serve-dashboard")
                           ["data"]["praxis-serve-dashboard.json"])
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v.get("query", {}).get("query", "") if isinstance(v.get("query"), dict)
                else v.get("query", "") for v in dashboard["templating"]["list"]]
    assert len(queries) > 10
    dashboard_names = set().union(*(dc.metric_references(q) for q in queries))
    assert adapter <= served and dashboard_names <= served, (adapter | dashboard_names) - served
    assert "praxis_queue_depth" in dc.metric_families(cpu_server.metrics_text)


def test_affinity_hashes_on_the_client_header():
    """The Envoy example routes by a consistent hash of the header the clients set, to the
    headless Service's port that the server listens on."""
    objects = dc.render("affinity")
    config = yaml.safe_load(dc.one(objects, "ConfigMap")["data"]["envoy-config.yaml"])
    cluster = config["static_resources"]["clusters"][0]
    assert cluster["lb_policy"] == "RING_HASH" and cluster["type"] == "STRICT_DNS"
    routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[0]["route"]["hash_policy"] == [{"header": {"header_name": dc.LAYOUT_HEADER}}]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
        "address"]["socket_address"]
    base = dc.render("base")
    headless = dc.one(base, "Service", "praxis-serve-headless")
    assert endpoint["address"] == headless["metadata"]["name"]
    assert endpoint["port_value"] == headless["spec"]["ports"][0]["port"]
    assert cluster["health_checks"][0]["grpc_health_check"]["service_name"] == dc.server_container(
        dc.one(base, "Deployment"))["readinessProbe"]["grpc"]["service"]


def test_images_are_the_built_image():
    """Every container of an overlay, init containers too, runs the image the Dockerfile builds."""
    for overlay in dc.OVERLAYS:
        spec = dc.one(dc.render(overlay), "Deployment")["spec"]["template"]["spec"]
        images = {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
        assert images == {"localhost/praxis-serve:latest"}, (overlay, images)


def test_gpu_overlay_requests_a_gpu_and_mounts_the_checkpoint(help_flags):
    objects = dc.render("overlays/gpu")
    deployment = dc.one(objects, "Deployment")
    container = dc.server_container(deployment)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    flags = dc.effective_flags(objects, deployment, help_flags)
    assert flags["device"] == "cuda"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert any(flags["checkpoint"].startswith(p + "/") and m.get("readOnly")
               for p, m in mounts.items()), flags["checkpoint"]
    claim = dc.one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim for v in volumes)


@pytest.fixture(scope="module")
def tls_workload(tmp_path_factory):
    """The tls overlay with the token-auth component, rendered, and praxis-server run as its
    Deployment runs it: its flagfiles and args, with each mounted Secret's path replaced by a
    folder of files made at test time (an openssl CA and server certificate, a tokens file)."""
    root = tmp_path_factory.mktemp("tls")
    # kustomize loads only below the kustomization's root: a copy of deploy/ holds both.
    shutil.copytree(dc.DEPLOY, root / "deploy")
    (root / "deploy" / "tls-token").mkdir()
    (root / "deploy" / "tls-token" / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../overlays/tls"], "components": ["../components/token-auth"]}))
    objects = dc.render(str(root / "deploy" / "tls-token"))
    deployment = dc.one(objects, "Deployment", "praxis-serve")
    certs = make_certs(str(tmp_path_factory.mktemp("certs")))
    secrets = {"praxis-serve-tls": {"tls.crt": certs["server.crt"], "tls.key": certs["server.key"],
                                    "ca.crt": certs["ca.crt"]},
               "praxis-serve-tokens": {"tokens": str(root / "tokens")}}
    (root / "tokens").write_text("robot-token\n")
    mounts = dc.secret_mounts(deployment)
    assert set(mounts.values()) == set(secrets), mounts

    def local(text):
        for path, secret in mounts.items():
            for key, file in secrets[secret].items():
                text = text.replace(f"{path}/{key}", file)
        return text

    flagfiles = []
    for path, text in dc.flagfiles(objects, deployment):
        flagfiles.append(str(root / os.path.basename(path)))
        with open(flagfiles[-1], "w") as f:
            f.write(local(text))
    args = [local(a) for a in dc.server_container(deployment)["args"]
            if not a.startswith("--flagfile=")]
    s = Server(f"--flagfile={','.join(flagfiles)}", *args, "--host=127.0.0.1", "--port=0",
               "--metrics_port=0")

    def exec_serving(command):
        argv = [dc.CLI] + [f"--address={s.address}" if a.startswith("--address=") else local(a)
                           for a in command[1:]]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        return r.returncode == 0 and r.stdout.strip() == "SERVING"

    yield dict(objects=objects, server=s, exec_serving=exec_serving, ca=certs["ca.crt"],
               metric_names=dc.metric_families(scrape(s.metrics_port)))
    s.stop()


def test_tls_overlay_probes_answer_serving(tls_workload, help_flags):
    """The exec probes (praxis-cli health over TLS with the Secret's CA) pass against the server
    run with the overlay's flags, while the base's plaintext gRPC probe would not."""
    w = tls_workload
    problems = dc.check_server_workload(
        w["objects"], help_flags, health_serving=lambda service: False,
        metric_names=w["metric_names"], metrics_path=METRICS_PATH, exec_serving=w["exec_serving"])
    assert problems == []
    assert not health(w["server"].address, "praxis.v1.Praxis")  # plaintext: refused
    # The token component is in force: a call other than health needs the token.
    info = subprocess.run([dc.CLI, "info", f"--address={w['server'].address}",
                           f"--tls_ca={w['ca']}", "--tls_server_name=praxis-serve"],
                          capture_output=True, text=True, timeout=60)
    assert info.returncode == 1 and "UNAUTHENTICATED" in info.stderr, info


def test_tls_overlay_probe_without_the_ca_fails(tls_workload, help_flags):
    """The check can fail: a readiness probe that does not trust the Secret's CA is caught."""
    w = tls_workload
    objects = copy.deepcopy(w["objects"])
    probe = dc.server_container(dc.one(objects, "Deployment"))["readinessProbe"]["exec"]
    probe["command"] = [a for a in probe["command"] if not a.startswith("--tls_ca=")] + ["--tls"]
    problems = dc.check_server_workload(
        objects, help_flags, health_serving=lambda service: False,
        metric_names=w["metric_names"], metrics_path=METRICS_PATH, exec_serving=w["exec_serving"])
    assert [p for p in problems if p.startswith("readinessProbe")], problems
