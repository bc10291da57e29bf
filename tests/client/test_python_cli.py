"""python -m praxis_client health|info|step (client/python, from the source tree) against the real
praxis-server: the same answers and step files as praxis-cli, its exit statuses, and TLS, mTLS
and the bearer token from the command line.

Environment (set by CTest): PRAXIS_SERVER_BIN, PRAXIS_CLI_BIN, PRAXIS_PROTO_DIR, PRAXIS_PY_STUBS
and PYTHONPATH holding client/python.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("PRAXIS_CLI_BIN", os.path.join(SRC, "build", "client", "praxis-cli"))

from certs import make_certs  # noqa: E402
from server_process import Server, save_inputs  # noqa: E402


def py_cli(*args, timeout=120):
    """python -m praxis_client `args`, with client/python first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SRC, "client", "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-m", "praxis_client", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def cpp_cli(*args, timeout=120):
    """praxis-cli `args`, for the answers python -m praxis_client must match."""
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def metadata(path):
    """The string metadata of the safetensors file `path`."""
    with safe_open(str(path), framework="numpy") as f:
        return f.metadata()


def test_health(server):
    address = f"--address={server.address}"
    for service in ([], ["--service=praxis.v1.Praxis"]):
        r = py_cli("health", address, *service)
        assert (r.returncode, r.stdout) == (0, "SERVING\n"), r
    r = py_cli("health", address, "--service=no.such.Service")
    assert r.returncode == 1 and "server: NOT_FOUND" in r.stderr, r


def test_info_prints_what_praxis_cli_prints(server):
    address = f"--address={server.address}"
    py, cpp = py_cli("info", address), cpp_cli("info", address)
    assert py.returncode == cpp.returncode == 0, (py, cpp)
    assert py.stdout == cpp.stdout
    info = json.loads(py_cli("info", address, "--json").stdout)
    assert info["dtype"] == "float32" and "tap.1" in info["outputs"]


def test_step_file_equals_praxis_cli(server, tmp_path):
    save_inputs(tmp_path / "in.safetensors", seed=5)
    common = [f"--address={server.address}", f"--inputs={tmp_path / 'in.safetensors'}",
              "--outputs=velocity,cond,taps,embeddings,positions"]
    py = py_cli("step", *common, f"--out={tmp_path / 'py.safetensors'}")
    cpp = cpp_cli("step", *common, f"--out={tmp_path / 'cpp.safetensors'}")
    assert py.returncode == cpp.returncode == 0, (py, cpp)
    assert py.stdout.startswith("step ok: layout L5_a3x4_K2_F1_g3x4_dec_rs0,0,0,0,"), py.stdout
    ours = load_file(str(tmp_path / "py.safetensors"))
    theirs = load_file(str(tmp_path / "cpp.safetensors"))
    assert sorted(ours) == sorted(theirs) == sorted(
        ["velocity", "cond", "tap.0", "tap.1", "embeddings", "positions"])
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype, name
        assert np.array_equal(ours[name], theirs[name]), name
    ours, theirs = metadata(tmp_path / "py.safetensors"), metadata(tmp_path / "cpp.safetensors")
    assert sorted(ours) == sorted(theirs)
    for key in ("layout_key", "noised_span", "batch_rows"):
        assert ours[key] == theirs[key], key


def test_step_of_a_random_layout(server, tmp_path):
    out = tmp_path / "out.safetensors"
    r = py_cli("step", f"--address={server.address}", "--layout=5,3,4,2,1", "--batch=2",
               "--seed=3", "--outputs=velocity,tap.1", "--wire_dtype=bfloat16", f"--out={out}")
    assert r.returncode == 0, r
    tensors = load_file(str(out))
    assert sorted(tensors) == ["tap.1", "velocity"]
    assert tensors["velocity"].shape == (2, 16, 2, 3, 4)
    for a in tensors.values():  # bfloat16 on the wire: float32 holding bfloat16 values
        assert a.dtype == np.float32 and not (a.view(np.uint32) & 0xFFFF).any()
    assert int(metadata(out)["batch_rows"]) >= 2  # rows of the batch it ran in


@pytest.mark.parametrize("args, status, message", [
    (["--layout=5,3,4,2,1"], 2, "--out: missing"),
    (["--layout=5,3,4,2,1", "--inputs=x", "--out=o"], 2,
     "--inputs, --layout: give exactly one"),
    (["--layout=5,3,4", "--out=o"], 2, "--layout: expected five positive integers"),
    (["--layout=5,3,4,2,1", "--out=o", "--outputs=velocity,speed"], 2, "outputs: expected"),
    (["--layout=5,3,4,2,1", "--out=o", "--rope_shifts=1,2"], 2, "--rope_shifts: expected 4"),
    (["--layout=5,3,4,2,1", "--out=o", "--timeout=soon"], 2, "--timeout"),
    (["--inputs=/nonexistent.safetensors", "--out=o"], 2, "inputs: cannot read"),
    (["--layout=5,3,4,2,1", "--out=o", "--decode=false", "--outputs=velocity"], 1,
     "server: INVALID_ARGUMENT"),
    (["--layout=5,3,4,2,1", "--out=o", "--wire_dtype=int8"], 2, "wire_dtype: expected"),
])
def test_step_errors_name_the_field(server, tmp_path, args, status, message):
    r = py_cli("step", f"--address={server.address}", *args)
    assert r.returncode == status and message in r.stderr, r


def test_inputs_missing_a_tensor(server, tmp_path):
    save_file({"text": np.zeros((1, 5, 48), np.float32)}, str(tmp_path / "in.safetensors"))
    r = py_cli("step", f"--address={server.address}", f"--inputs={tmp_path / 'in.safetensors'}",
               f"--out={tmp_path / 'out.safetensors'}")
    assert r.returncode == 2 and "anchor: no tensor of that name" in r.stderr, r


def test_tls_client_certificate_and_token(tmp_path):
    c = make_certs(str(tmp_path))
    (tmp_path / "tokens").write_text("robot-token\n")
    server = Server(f"--tls_cert={c['server.crt']}", f"--tls_key={c['server.key']}",
                    f"--tls_client_ca={c['ca.crt']}", f"--auth_token_file={tmp_path / 'tokens'}")
    address = f"--address={server.address}"  # 127.0.0.1: in the certificate's names
    mtls = [f"--tls_ca={c['ca.crt']}", f"--tls_cert={c['client.crt']}",
            f"--tls_key={c['client.key']}", "--max_attempts=1", "--timeout=20s"]
    token = f"--token_file={tmp_path / 'tokens'}"
    try:
        assert py_cli("health", address, *mtls).stdout == "SERVING\n"  # health needs no token
        refused = py_cli("info", address, *mtls)
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused
        assert py_cli("info", address, *mtls, token).returncode == 0
        step = py_cli("step", address, *mtls, token, "--layout=5,3,4,1,1",
                      f"--out={tmp_path / 'out.safetensors'}")
        assert step.returncode == 0, step
        named = py_cli("health", address, *mtls, "--tls_server_name=praxis-serve")
        assert named.returncode == 0, named
        wrong = py_cli("health", address, *mtls, "--tls_server_name=elsewhere.example")
        assert wrong.returncode == 1 and "UNAVAILABLE" in wrong.stderr, wrong
        bare = py_cli("health", address, f"--tls_ca={c['ca.crt']}", "--max_attempts=1",
                      "--timeout=20s")  # no client certificate: the handshake fails
        assert bare.returncode == 1 and "UNAVAILABLE" in bare.stderr, bare
        half = py_cli("health", address, f"--tls_ca={c['ca.crt']}",
                      f"--tls_cert={c['client.crt']}")
        assert half.returncode == 2 and "tls_cert and tls_key" in half.stderr, half
    finally:
        server.stop()
