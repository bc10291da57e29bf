"""The image really builds and runs: podman builds the Dockerfile on an offline Debian base, then
runs the cpu overlay's server container as the kubelet would (its args, its mounted flagfiles,
its user, a read-only root, its ports published on 127.0.0.1), and the real clients talk to it.
Nothing is pulled from a registry (--pull=never)."""
import json
import os
import subprocess
import time

import pytest

import deploy_checks as dc
from deploy_checks import CLI, health, scrape

IMAGE = "localhost/praxis-serve:test"
BASE = "localhost/praxis-base:bookworm"
ENV = dict(os.environ, CONTAINERS_CONF=os.path.join(dc.DEPLOY, "podman", "containers.conf"))
CACHE = os.path.expanduser("~/.cache")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
LOG = os.path.join(os.environ.get("PRAXIS_BUILD_DIR", os.path.join(dc.SRC, "build")),
                   "image-build.log")


def podman(*args, check=True, timeout=600):
    r = subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {r.returncode}\n{r.stdout}{r.stderr}")
    return r


def remove_interrupted_builds():
    """An interrupted podman build (a killed or timed-out run) leaves its working containers
    behind, listed only with --external and in status Storage; they pin the dangling images that
    the prune gives back, and the prune then fails. Called once this run's own build is done."""
    listed = podman("ps", "--all", "--external", "--format", "{{.ID}} {{.Status}}").stdout
    stale = [f[0] for f in map(str.split, listed.splitlines()) if f[1:] == ["Storage"]]
    if stale:
        podman("rm", "--force", *stale)


@pytest.fixture(scope="module")
def image():
    """The Dockerfile built with the offline base for both stages. The base stands in for the
    CUDA images; the CUDA toolkit those carry is mounted from this machine, read-only, and the
    machine's ccache and pip caches make a rebuild cheap."""
    subprocess.run(["bash", os.path.join(dc.DEPLOY, "podman", "make-base.sh"), BASE], env=ENV,
                   check=True)
    cuda = os.path.realpath("/usr/local/cuda")
    volumes = [f"{cuda}:{cuda}:ro", f"{cuda}:/usr/local/cuda:ro"]
    # The machine's CA store, in case its way to PyPI is a TLS-intercepting proxy.
    if os.path.exists(CA_BUNDLE):
        volumes.append(f"{os.path.realpath(CA_BUNDLE)}:{CA_BUNDLE}:ro")
    for cache, target in (("ccache", "/root/.cache/ccache"), ("pip", "/root/.cache/pip")):
        os.makedirs(os.path.join(CACHE, cache), exist_ok=True)
        volumes.append(f"{os.path.join(CACHE, cache)}:{target}")
    cmd = ["podman", "build", "--pull=never", "--format=docker", "--layers",
           f"--build-arg=BUILD_IMAGE={BASE}", f"--build-arg=RUNTIME_IMAGE={BASE}",
           *[f"--volume={v}" for v in volumes]]
    # The build stage is tagged too, so that its layers (setup: packages and torch) stay cached
    # for the next run while the prune below gives back what earlier runs left dangling.
    with open(LOG, "w") as log:
        for target in (["--target=build", f"--tag={IMAGE}-build"], [f"--tag={IMAGE}"]):
            r = subprocess.run([*cmd, *target, dc.SRC], env=ENV, stdout=log,
                               stderr=subprocess.STDOUT)
            if r.returncode != 0:
                break
    if r.returncode != 0:
        with open(LOG) as log:
            raise AssertionError(f"podman build failed ({r.returncode}):\n{log.read()[-6000:]}")
    remove_interrupted_builds()
    podman("image", "prune", "--force")
    return IMAGE


def test_image_holds_only_the_programs(image):
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "10001:10001"
    assert set(config["ExposedPorts"]) == {"50051/tcp", "9090/tcp"}
    assert inspected["Healthcheck"]["Test"][1:3] == ["praxis-cli", "health"]
    listing = podman("run", "--rm", "--entrypoint=/bin/sh", image, "-c",
                     "ls /opt/praxis/bin; command -v c++ cmake nvcc python3 || true").stdout
    assert listing.split() == ["praxis-cli", "praxis-load", "praxis-server"]


@pytest.fixture(scope="module")
def container(image, tmp_path_factory):
    """The cpu overlay's server container, run by podman the way its Deployment describes it."""
    objects = dc.render("overlays/cpu")
    deployment = dc.one(objects, "Deployment", "praxis-serve")
    spec = deployment["spec"]["template"]["spec"]
    c = dc.server_container(deployment)
    flags_dir = tmp_path_factory.mktemp("etc-praxis")
    for path, text in dc.flagfiles(objects, deployment):
        (flags_dir / os.path.basename(path)).write_text(text)
    os.chmod(flags_dir, 0o755)
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "flags")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    name = f"praxis-test-{os.getpid()}"
    podman("rm", "--force", name, check=False)
    run = ["run", "--detach", f"--name={name}", f"--user={spec['securityContext']['runAsUser']}",
           "--cap-drop=all", "--security-opt=no-new-privileges", f"--volume={flags_dir}:{mount}:ro"]
    if c["securityContext"].get("readOnlyRootFilesystem"):
        run += ["--read-only", "--tmpfs=/tmp"]
    run += [f"--publish=127.0.0.1::{p}" for p in ports.values()]
    podman(*run, image, *c["args"])
    published = {k: podman("port", name, f"{p}/tcp").stdout.strip().rsplit(":", 1)[1]
                 for k, p in ports.items()}
    info = dict(name=name, container=c, spec=spec, grpc=f"127.0.0.1:{published['grpc']}",
                metrics_port=int(published["metrics"]))
    try:
        deadline = time.monotonic() + 300
        while not health(info["grpc"], c["startupProbe"]["grpc"]["service"]):
            state = json.loads(podman("inspect", name).stdout)[0]["State"]
            assert state["Running"], podman("logs", name).stdout + podman("logs", name).stderr
            assert time.monotonic() < deadline, "not SERVING after 300 s"
            time.sleep(2)
        yield info
    finally:
        podman("rm", "--force", "--time=5", name, check=False)


def test_probes_and_healthcheck_answer(container):
    c = container["container"]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert health(container["grpc"], c[kind]["grpc"]["service"]), kind
    # The image's own HEALTHCHECK, run inside the container as its user.
    assert podman("healthcheck", "run", container["name"], check=False).returncode == 0


def test_one_step_and_metrics(container, tmp_path):
    out = tmp_path / "out.safetensors"
    r = subprocess.run([CLI, "step", f"--address={container['grpc']}", "--layout=16,4,4,2,1",
                        f"--out={out}", "--timeout=120s"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.stat().st_size > 0
    text = scrape(container["metrics_port"])
    assert 'praxis_requests_total{code="OK",method="Step"} 1' in text, text[:2000]
    assert 'praxis_serving 1' in text


def test_prestop_then_sigterm_drains_within_the_grace(container):
    """Last: the kubelet's shutdown — the preStop command, then SIGTERM with the pod's grace."""
    podman("exec", container["name"], *container["container"]["lifecycle"]["preStop"]["exec"]["command"])
    grace = container["spec"]["terminationGracePeriodSeconds"]
    started = time.monotonic()
    podman("stop", f"--time={grace}", container["name"], timeout=grace + 30)
    state = json.loads(podman("inspect", container["name"]).stdout)[0]["State"]
    assert state["ExitCode"] == 0 and time.monotonic() - started < grace
    assert "draining" in podman("logs", container["name"]).stdout
