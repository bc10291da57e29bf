"""Issue 12's security posture through the real praxis-server process and every client: bearer
tokens (praxis-cli, praxis-load, the Python client), mTLS with the Python client, reflection off,
/metrics on 127.0.0.1 and free of paths, and clients that refuse a hostile server's answers.

Environment (set by CTest): PRAXIS_SERVER_BIN, PRAXIS_CLI_BIN, PRAXIS_LOAD_BIN, PRAXIS_SOURCE_DIR,
PRAXIS_PROTO_DIR and PYTHONPATH holding client/python.
"""
import os
import re
import subprocess
import sys
import urllib.request

import grpc
import pytest

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("PRAXIS_CLI_BIN", os.path.join(SRC, "build", "client", "praxis-cli"))
LOAD = os.environ.get("PRAXIS_LOAD_BIN", os.path.join(SRC, "build", "client", "praxis-load"))
os.environ.setdefault("PRAXIS_PROTO_DIR", os.path.join(SRC, "proto"))
if os.path.join(SRC, "client", "python") not in sys.path:
    sys.path.insert(0, os.path.join(SRC, "client", "python"))

from certs import make_certs  # noqa: E402
from server_process import Server, loopback_server, save_inputs, tiny_inputs  # noqa: E402
from praxis_client import Client, ProtocolError, RpcFailed, pb  # noqa: E402

TOKENS = "# robots\nalpha-token\n\nbeta-token\n"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    d = tmp_path_factory.mktemp("secrets")
    (d / "tokens").write_text(TOKENS)
    (d / "beta").write_text("beta-token\n")
    (d / "wrong").write_text("gamma-token\n")
    return d


@pytest.fixture(scope="module")
def auth_server(secrets):
    """Tokens required, reflection off, /metrics on 127.0.0.1, a model named by a config path."""
    s = Server(f"--auth_token_file={secrets / 'tokens'}", "--reflection=false",
               "--metrics_host=127.0.0.1", "--metrics_port=0",
               f"--config={os.path.join(SRC, 'configs', 'tiny.json')}")
    yield s
    s.stop()


def run(*args, timeout=120):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def test_cli_sends_the_token_file(auth_server, secrets, tmp_path):
    address = f"--address={auth_server.address}"
    refused = run(CLI, "info", address)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused
    assert "no bearer token" in refused.stderr
    wrong = run(CLI, "info", address, f"--token_file={secrets / 'wrong'}")
    assert wrong.returncode == 1 and "invalid bearer token" in wrong.stderr, wrong
    assert run(CLI, "info", address, f"--token_file={secrets / 'beta'}").returncode == 0
    # Health is exempt by default: probes carry no token.
    health = run(CLI, "health", address)
    assert health.returncode == 0 and health.stdout.strip() == "SERVING", health
    save_inputs(tmp_path / "in.safetensors")
    step = [CLI, "step", address, f"--inputs={tmp_path / 'in.safetensors'}",
            f"--out={tmp_path / 'out.safetensors'}"]
    assert run(*step).returncode == 1
    ok = run(*step, f"--token_file={secrets / 'tokens'}")  # the first token of the file
    assert ok.returncode == 0, ok


def test_load_sends_the_token_file(auth_server, secrets):
    args = [LOAD, f"--address={auth_server.address}", "--mix=5,3,4,2,1", "--requests=4",
            "--concurrency=2", "--warmup=0s", "--duration=60s", "--progress_interval=60s"]
    assert run(*args).returncode != 0
    r = run(*args, f"--token_file={secrets / 'beta'}")
    assert r.returncode == 0, r.stderr


def test_python_client_sends_the_token(auth_server, secrets):
    inputs = tiny_inputs()
    for kwargs in ({}, {"token": "gamma-token"}):
        with Client(auth_server.address, max_attempts=1, **kwargs) as c:
            for call in (lambda: c.step(**inputs), c.info,
                         lambda: c.session(timeout=60).step(**inputs)):
                with pytest.raises(RpcFailed) as e:
                    call()
                assert e.value.code == UNAUTHENTICATED, e.value
            assert c.health() == "SERVING"
    for kwargs in ({"token": "alpha-token"}, {"token_file": str(secrets / "tokens")}):
        with Client(auth_server.address, max_attempts=1, **kwargs) as c:
            assert "velocity" in c.step(**inputs).tensors
            assert c.info().dtype == "float32"
            with c.session(timeout=60) as s:
                assert "velocity" in s.step(**inputs).tensors


def listening_addresses(port):
    """The IPv4 addresses a socket listens on at `port`, from /proc/net/tcp ("127.0.0.1", ...)."""
    found = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, local_port = local.split(":")
            if state == "0A" and int(local_port, 16) == port:
                found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


def test_metrics_host_binds_the_address_given(auth_server):
    assert listening_addresses(auth_server.metrics_port) == {"127.0.0.1"}
    default = Server("--metrics_port=0")
    try:
        assert listening_addresses(default.metrics_port) == {"0.0.0.0"}
    finally:
        default.stop()


def test_no_metric_label_holds_a_path(auth_server):
    with urllib.request.urlopen(f"http://127.0.0.1:{auth_server.metrics_port}/metrics") as r:
        text = r.read().decode()
    values = re.findall(r'\w+="([^"]*)"', text)
    assert len(values) > 5
    assert [v for v in values if "/" in v] == []
    assert 'model="tiny.json"' in text  # the config's file name, not its path


def list_services(address):
    """ServerReflectionInfo with list_services (field 7), as raw bytes: the first answer."""
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return next(call(iter([b"\x3a\x00"]), timeout=30))


def test_reflection_can_be_switched_off(auth_server):
    with pytest.raises(grpc.RpcError) as e:
        list_services(auth_server.address)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    default = Server()
    try:
        assert b"praxis.v1.Praxis" in list_services(default.address)
    finally:
        default.stop()


def test_python_mtls_with_a_token(tmp_path, secrets):
    c = make_certs(str(tmp_path))
    server = Server(f"--tls_cert={c['server.crt']}", f"--tls_key={c['server.key']}",
                    f"--tls_client_ca={c['ca.crt']}", f"--auth_token_file={secrets / 'tokens'}")
    port = server.address.rsplit(":", 1)[1]
    try:
        with Client(f"localhost:{port}", tls_ca=c["ca.crt"], tls_cert=c["client.crt"],
                    tls_key=c["client.key"], token="alpha-token", max_attempts=1) as client:
            assert client.health() == "SERVING"
            assert "velocity" in client.step(**tiny_inputs()).tensors
        with Client(f"localhost:{port}", tls_ca=c["ca.crt"], max_attempts=1, timeout=10) as bare:
            with pytest.raises(RpcFailed) as e:  # no client certificate: the handshake fails
                bare.health()
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(ValueError):
            Client(f"localhost:{port}", tls_ca=c["ca.crt"], tls_cert=c["client.crt"])
    finally:
        server.stop()


# Headers a hostile or broken server might announce; each must be refused, never crash a client.
HOSTILE = {
    "2^62 floats": dict(shape=[1 << 62], nbytes=0),
    "2^31 x 2^31": dict(shape=[1 << 31, 1 << 31], nbytes=0),
    "2^62 x 1 x 1": dict(shape=[1 << 62, 1, 1], nbytes=0),
    "0 x 2^40 x 2^40": dict(shape=[0, 1 << 40, 1 << 40], nbytes=0),
    "negative": dict(shape=[-1, 4], nbytes=16),
    "nbytes too small": dict(shape=[4], nbytes=8),
    "nbytes too large": dict(shape=[4], nbytes=1 << 40),
    "nine dimensions": dict(shape=[1] * 9, nbytes=4),
}


class Hostile(grpc.GenericRpcHandler):
    """praxis.v1.Praxis/Step answered with one hostile header (self.header), 16 bytes, a trailer."""

    header = None

    def service(self, details):
        def step(request, context):
            yield pb.StepResponse(header=pb.StepHeader(tensors=[self.header]))
            yield pb.StepResponse(chunk=pb.TensorChunk(name="velocity", offset=0, data=b"\0" * 16))
            yield pb.StepResponse(trailer=pb.StepTrailer())

        if details.method == "/praxis.v1.Praxis/Step":
            return grpc.unary_stream_rpc_method_handler(
                step, request_deserializer=lambda b: b,
                response_serializer=lambda m: m.SerializeToString())
        return None


@pytest.fixture(scope="module")
def hostile():
    with loopback_server(Hostile(), workers=2) as h:
        yield h


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_clients_refuse_a_hostile_header(hostile, case, tmp_path):
    hostile.header = pb.TensorHeader(name="velocity", dtype=pb.FLOAT32, **HOSTILE[case])
    with Client(hostile.address, max_attempts=1) as c:
        with pytest.raises(ProtocolError) as e:
            c.step(**tiny_inputs())
        assert e.value.code == grpc.StatusCode.DATA_LOSS
        assert "velocity" in e.value.message
    save_inputs(tmp_path / "in.safetensors")
    r = run(CLI, "step", f"--address={hostile.address}", f"--inputs={tmp_path / 'in.safetensors'}",
            f"--out={tmp_path / 'out.safetensors'}")
    assert r.returncode == 1, r  # the C++ client: an error from the server, not an abort
    assert "DATA_LOSS" in r.stderr and "velocity" in r.stderr, r.stderr


def test_a_sane_header_from_the_same_server_is_accepted(hostile):
    """The hostile server's stream is otherwise well-formed: the refusals above are the header's."""
    hostile.header = pb.TensorHeader(name="velocity", dtype=pb.FLOAT32, shape=[4], nbytes=16)
    with Client(hostile.address, max_attempts=1) as c:
        assert c.step(**tiny_inputs()).tensors["velocity"].shape == (4,)
