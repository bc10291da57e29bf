import os
import subprocess

import pytest

import deploy_checks as dc
from deploy_checks import scrape
from server_process import SERVER, Server


@pytest.fixture(scope="session")
def help_flags():
    """{flag: default} as `praxis-server --help` prints them."""
    out = subprocess.run([SERVER, "--help"], capture_output=True, text=True)
    flags = dc.parse_help(out.stdout + out.stderr)
    assert {"port", "metrics_port", "drain_seconds", "checkpoint"} <= flags.keys(), out.stdout
    return flags


@pytest.fixture(scope="session")
def cpu_server(tmp_path_factory):
    """praxis-server run with the cpu overlay's own flagfiles, on free loopback ports."""
    objects = dc.render("overlays/cpu")
    deployment = dc.one(objects, "Deployment", "praxis-serve")
    directory = tmp_path_factory.mktemp("flags")
    paths = []
    for path, text in dc.flagfiles(objects, deployment):
        paths.append(str(directory / os.path.basename(path)))
        with open(paths[-1], "w") as f:
            f.write(text)
    s = Server(f"--flagfile={','.join(paths)}", "--host=127.0.0.1", "--port=0", "--metrics_port=0")
    # One step first: the per-method families (requests, latency) appear with their first call.
    r = subprocess.run([dc.CLI, "step", f"--address={s.address}", "--layout=16,4,4,2,1",
                        f"--out={directory / 'out.safetensors'}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s.metrics_text = scrape(s.metrics_port)
    yield s
    s.stop()
