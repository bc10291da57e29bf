"""`pip install client/python` into a fresh virtual environment, then the installed package used
from outside the source tree against the real praxis-server (issue 15): stubs under
praxis_client._proto and no top-level `praxis`, a step through the Python API and through
`python -m praxis_client`, equal to praxis-cli's.

The venv starts empty (no --system-site-packages): pip builds the wheel (setuptools and
grpcio-tools in its isolated build environment) and installs grpcio, protobuf, numpy and
safetensors, all from PyPI. What pip and the steps print is written to the test's output.

Environment (set by CTest): PRAXIS_SERVER_BIN, PRAXIS_CLI_BIN, PRAXIS_SOURCE_DIR.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from server_process import save_inputs

SRC = os.path.abspath(os.environ.get("PRAXIS_SOURCE_DIR") or
                      os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("PRAXIS_CLI_BIN", os.path.join(SRC, "build", "client", "praxis-cli"))
# Nothing of the source tree may leak into the installed package's processes.
_SOURCE_TREE_ENV = ("PYTHONPATH", "PRAXIS_PROTO_DIR", "PRAXIS_PY_STUBS", "VIRTUAL_ENV",
                    "PYTHONHOME")
_SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"


def show(capsys, title, text):
    """Prints `text` under `title` past pytest's capture, so that the test log holds it."""
    with capsys.disabled():
        print(f"\n----- {title}\n{text.rstrip()}", flush=True)


class Venv:
    """A fresh venv under `root`; run() executes its programs with cwd `root`, outside the
    source tree, and an environment free of the source tree's settings."""

    def __init__(self, root):
        self.root = str(root)
        self.bin = os.path.join(self.root, "venv", "bin")
        self.env = {k: v for k, v in os.environ.items() if k not in _SOURCE_TREE_ENV}
        # As scripts/setup.sh: pip trusts the system's CA store (a TLS-intercepting proxy's CA).
        if "PIP_CERT" not in self.env and os.path.isfile(_SYSTEM_CAS):
            self.env["PIP_CERT"] = _SYSTEM_CAS

    def run(self, program, *args, timeout=300, env=None):
        return subprocess.run([os.path.join(self.bin, program), *args], cwd=self.root,
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    v = Venv(tmp_path_factory.mktemp("wheel"))
    made = subprocess.run([sys.executable, "-m", "venv", os.path.join(v.root, "venv")],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made
    pip = v.run("python", "-m", "pip", "install", os.path.join(SRC, "client", "python"),
                timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return v, pip.stdout


def test_pip_install_from_a_fresh_venv(venv, capsys):
    v, pip_output = venv
    lines = pip_output.strip().splitlines()
    show(capsys, f"pip install {os.path.join(SRC, 'client', 'python')} (last lines)",
         "\n".join(lines[-4:]))
    assert "praxis-client" in lines[-1] and lines[-1].startswith("Successfully installed")


PROBE = """
import importlib.metadata as md, importlib.util, json, sys
import praxis_client
from praxis_client import pb
from praxis_client._proto import praxis_pb2_grpc
print(json.dumps({
    "package": praxis_client.__file__, "pb": pb.__file__, "grpc": praxis_pb2_grpc.__file__,
    "message_module": pb.StepRequest.__module__,
    "top_level_praxis": importlib.util.find_spec("praxis") is not None,
    "files": sorted(str(f) for f in md.files("praxis-client")),
    "requires": md.requires("praxis-client"),
    "path": sys.path}))
"""


def test_installed_layout(venv, capsys):
    v, _ = venv
    r = v.run("python", "-c", PROBE)
    assert r.returncode == 0, r
    got = json.loads(r.stdout)
    site = os.path.join(v.root, "venv", "lib")
    for key in ("package", "pb", "grpc"):
        assert got[key].startswith(site), (key, got[key])
    assert got["pb"].endswith(os.path.join("praxis_client", "_proto", "praxis_pb2.py"))
    assert got["message_module"] == "praxis_client._proto.praxis_pb2"
    assert not got["top_level_praxis"]
    assert not any(p.startswith(os.path.join(SRC, "client")) for p in got["path"])
    packaged = [f for f in got["files"] if not f.startswith(("..", "praxis_client-"))
                and "__pycache__" not in f]
    show(capsys, "files the wheel installed", "\n".join(packaged))
    assert all(f.startswith("praxis_client/") for f in packaged), packaged
    assert {"praxis_client/_proto/praxis_pb2.py", "praxis_client/_proto/praxis_pb2_grpc.py",
            "praxis_client/__main__.py"} <= set(packaged)
    names = {req.split(">=")[0] for req in got["requires"] if "extra ==" not in req}
    assert names == {"grpcio", "protobuf", "numpy", "safetensors"}, got["requires"]


API_STEP = """
import json, sys
import numpy as np
from praxis_client import Client
rng = np.random.default_rng(0)
inputs = dict(text=rng.standard_normal((1, 5, 48), dtype=np.float32),
              anchor=rng.standard_normal((1, 16, 1, 3, 4), dtype=np.float32),
              noised=rng.standard_normal((1, 16, 2, 3, 4), dtype=np.float32),
              clean=rng.standard_normal((1, 16, 1, 3, 4), dtype=np.float32),
              timesteps=rng.random((1, 2), dtype=np.float32), frames_per_chunk=1)
with Client(sys.argv[1]) as c:
    health = c.health()
    r = c.step(**inputs, outputs=["velocity", "tap.1"])
    with c.session(timeout=60) as s:
        again = s.step(**inputs, outputs=["velocity", "tap.1"])
print(json.dumps({
    "health": health, "layout_key": r.layout_key, "compute_us": r.compute_us,
    "shapes": {k: list(v.shape) for k, v in r.tensors.items()},
    "finite": bool(np.isfinite(r.tensors["velocity"]).all()),
    "session_equal": all(np.array_equal(again.tensors[k], r.tensors[k]) for k in r.tensors)}))
"""


def test_step_through_the_python_api(venv, server, capsys):
    v, _ = venv
    r = v.run("python", "-c", API_STEP, server.address)
    show(capsys, "the installed praxis_client: health, a step and the same step in a session",
         r.stdout + r.stderr)
    assert r.returncode == 0, r
    got = json.loads(r.stdout)
    assert got["health"] == "SERVING"
    assert got["layout_key"] == "L5_a3x4_K2_F1_g3x4_dec_rs0,0,0,0"
    assert got["shapes"]["velocity"] == [1, 16, 2, 3, 4]
    assert list(got["shapes"]) == ["velocity", "tap.1"] and got["shapes"]["tap.1"][2] == 64
    assert got["finite"] and got["session_equal"] and got["compute_us"] > 0


def test_step_through_python_m_praxis_client(venv, server, tmp_path, capsys):
    v, _ = venv
    address = f"--address={server.address}"
    health = v.run("python", "-m", "praxis_client", "health", address)
    script = v.run("praxis-client", "info", address)  # the console script
    assert (health.returncode, health.stdout) == (0, "SERVING\n"), health
    assert script.returncode == 0 and "dtype: float32" in script.stdout, script
    save_inputs(tmp_path / "in.safetensors", seed=7)
    common = [address, f"--inputs={tmp_path / 'in.safetensors'}"]
    py = v.run("python", "-m", "praxis_client", "step", *common,
               f"--out={tmp_path / 'py.safetensors'}")
    show(capsys, "python -m praxis_client health / step (installed)", health.stdout + py.stdout)
    cpp = subprocess.run([CLI, "step", *common, f"--out={tmp_path / 'cpp.safetensors'}"],
                         capture_output=True, text=True, timeout=120)
    assert py.returncode == cpp.returncode == 0, (py, cpp)
    ours = load_file(str(tmp_path / "py.safetensors"))
    theirs = load_file(str(tmp_path / "cpp.safetensors"))
    assert sorted(ours) == sorted(theirs) and "velocity" in ours
    for name in theirs:
        assert np.array_equal(ours[name], theirs[name]), name


def test_another_top_level_praxis_does_not_clash(venv, server, tmp_path):
    """A foreign `praxis` package (Google's ML library is one) first on sys.path: both import."""
    decoy = tmp_path / "decoy" / "praxis" / "v1"
    decoy.mkdir(parents=True)
    (decoy.parent / "__init__.py").write_text("DECOY = True\n")
    (decoy / "__init__.py").write_text("")
    (decoy / "praxis_pb2.py").write_text("raise ImportError('the decoy praxis.v1.praxis_pb2')\n")
    v, _ = venv
    code = ("import sys, praxis, praxis_client; assert praxis.DECOY; "
            "print(praxis_client.Client(sys.argv[1]).health())")
    r = v.run("python", "-c", code, server.address, env={"PYTHONPATH": str(tmp_path / "decoy")})
    assert (r.returncode, r.stdout) == (0, "SERVING\n"), r
