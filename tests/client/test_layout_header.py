"""The layout header (x-praxis-layout) that layout-affinity routing hashes on: every client sends
the key the server itself batches by (the StepHeader's layout_key), for every kind of layout.

A recording gRPC server on loopback stands in for a proxy: it keeps each call's metadata and
answers FAILED_PRECONDITION, so that no client retries; the keys it saw are compared with what the
real praxis-server answers for the same requests.
"""
import os
import subprocess
import sys

import grpc
import pytest

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("PRAXIS_CLI_BIN", os.path.join(SRC, "build", "client", "praxis-cli"))
os.environ.setdefault("PRAXIS_PROTO_DIR", os.path.join(SRC, "proto"))
if os.path.join(SRC, "client", "python") not in sys.path:
    sys.path.insert(0, os.path.join(SRC, "client", "python"))

from server_process import loopback_server, save_inputs, tiny_inputs  # noqa: E402
from praxis_client import LAYOUT_HEADER, Client, RpcFailed, layout_key, make_request  # noqa: E402

# (text_len, h, w, K, F, decode, rope_shifts): K = 1 has no clean chunks; enc-only; shifted.
LAYOUTS = [(5, 3, 4, 2, 1, True, None), (7, 2, 2, 1, 1, True, None),
           (4, 3, 3, 2, 2, False, None), (5, 3, 4, 2, 1, True, [1, 0, 2, 3])]


def step_kwargs(text_len, h, w, k, f, decode, shifts):
    kw = tiny_inputs(text_len=text_len, h=h, w=w, k=k, f=f)
    return dict(kw, decode=decode, rope_shifts=shifts, outputs=["cond"])


class Recorder(grpc.GenericRpcHandler):
    """Any call: its metadata is kept, and it is refused FAILED_PRECONDITION."""

    def __init__(self):
        self.seen = []

    def service(self, details):
        def refuse(request, context):
            self.seen.append((details.method, dict(context.invocation_metadata())))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "recorded")

        if details.method.endswith("/Session"):
            return grpc.stream_stream_rpc_method_handler(lambda it, ctx: refuse(next(it), ctx))
        return grpc.unary_stream_rpc_method_handler(refuse)


@pytest.fixture
def recorder():
    with loopback_server(Recorder(), workers=4) as r:
        yield r


@pytest.mark.parametrize("layout", LAYOUTS, ids=[str(l[:5]) for l in LAYOUTS])
def test_python_key_is_the_servers(server, layout):
    kw = step_kwargs(*layout)
    with Client(server.address) as c:
        assert c.step(**kw).layout_key == layout_key(make_request(**kw))


def test_python_client_sends_the_key(recorder):
    kw = step_kwargs(*LAYOUTS[0])
    with Client(recorder.address, max_attempts=1) as c:
        with pytest.raises(RpcFailed):
            c.step(**kw)
        session = c.session(layout=layout_key(make_request(**kw)))
        with pytest.raises(Exception):
            session.step(**kw)
    (step_method, step_md), (session_method, session_md) = recorder.seen
    assert step_method.endswith("/Step") and session_method.endswith("/Session")
    assert step_md[LAYOUT_HEADER] == session_md[LAYOUT_HEADER] == layout_key(make_request(**kw))


def test_cpp_client_sends_the_servers_key(server, recorder, tmp_path):
    """praxis-cli (the C++ Client, as praxis-load uses it) sends what the server answers."""
    inputs = tmp_path / "in.safetensors"
    save_inputs(inputs, text_len=6, h=3, w=4, k=2, f=1)
    args = ["step", f"--inputs={inputs}", "--outputs=cond", f"--out={tmp_path / 'out.safetensors'}"]
    real = subprocess.run([CLI, f"--address={server.address}", *args], capture_output=True,
                          text=True)
    assert real.returncode == 0, real.stderr
    key = real.stdout.split("step ok: layout ", 1)[1].split(", queue", 1)[0]
    refused = subprocess.run([CLI, f"--address={recorder.address}", *args], capture_output=True,
                             text=True)
    assert refused.returncode == 1 and "recorded" in refused.stderr, refused.stderr
    assert [md[LAYOUT_HEADER] for _, md in recorder.seen] == [key]
