"""The Python client (client/python, package praxis_client) against the real praxis-server.

Environment (defaults: the build/ of this source tree): PRAXIS_SERVER_BIN, PRAXIS_CLI_BIN,
PRAXIS_PROTO_DIR, and PYTHONPATH holding client/python. Each test fails, never skips, when a binary
is missing.
"""
import os
import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("PRAXIS_CLI_BIN", os.path.join(SRC, "build", "client", "praxis-cli"))
os.environ.setdefault("PRAXIS_PROTO_DIR", os.path.join(SRC, "proto"))
if os.path.join(SRC, "client", "python") not in sys.path:
    sys.path.insert(0, os.path.join(SRC, "client", "python"))

from server_process import Server, loopback_server, metric, tiny_inputs  # noqa: E402
from praxis_client import (Client, PraxisError, ProtocolError, RpcFailed,  # noqa: E402
                           StepFailed, assemble, make_request, pb)

ALL_OUTPUTS = ["velocity", "cond", "taps", "embeddings", "positions"]
ALL_NAMES = ["velocity", "cond", "tap.0", "tap.1", "embeddings", "positions"]


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address) as c:
        yield c


def to_bfloat16(x):
    """float32 rounded to the nearest bfloat16 (ties to even), as float32."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_health_and_info(client):
    assert client.health() == "SERVING"
    assert client.health("praxis.v1.Praxis") == "SERVING"
    with pytest.raises(RpcFailed) as e:
        client.health("no.such.Service")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    info = client.info()
    assert info.dtype == "float32"
    assert "tap.1" in info.outputs


def test_stubs_live_under_praxis_client():
    """The generated modules are praxis_client._proto's: nothing claims a top-level `praxis`."""
    assert pb.__name__ == "praxis_client._proto.praxis_pb2"
    assert pb.StepRequest.__module__ == pb.__name__
    assert [m for m in sys.modules if m == "praxis" or m.startswith("praxis.")] == []


def test_unavailable_is_retried_then_raised():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    with Client(address, timeout=5, max_attempts=2) as c:
        with pytest.raises(RpcFailed) as e:
            c.info()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


class Canceller(grpc.GenericRpcHandler):
    """Every call is cancelled by the server, as gRPC cancels the calls that reach a server (through
    a proxy) in the instant it shuts down; counts them."""

    def __init__(self):
        self.calls = 0

    def service(self, details):
        def cancel(request, context):
            self.calls += 1
            context.abort(grpc.StatusCode.CANCELLED, "server shutting down")

        return grpc.unary_stream_rpc_method_handler(cancel)


def test_a_far_side_cancel_is_retried_then_raised():
    with loopback_server(Canceller(), workers=2) as server, \
            Client(server.address, timeout=5, max_attempts=3) as c:
        with pytest.raises(RpcFailed) as e:
            c.step(**tiny_inputs())
    assert e.value.code == grpc.StatusCode.CANCELLED
    assert server.calls == 3, "a step is sent again after a CANCELLED it did not ask for"


def test_step_shapes_and_header(client):
    inputs = tiny_inputs()
    r = client.step(**inputs, outputs=ALL_OUTPUTS, request_id="shapes")
    assert list(r.tensors) == ALL_NAMES
    assert r.tensors["velocity"].shape == inputs["noised"].shape == (1, 16, 2, 3, 4)
    assert r.tensors["velocity"].dtype == np.float32
    tokens = r.tensors["tap.0"].shape[1]
    for name in ("tap.0", "tap.1", "embeddings"):
        assert r.tensors[name].shape == (1, tokens, 64)
    assert r.tensors["positions"].dtype == np.int64
    h = r.header
    assert h.request_id == "shapes"
    assert h.text_span.length == 5
    assert h.anchor_span.length == 3 * 4 and h.noised_span.length == 2 * 3 * 4
    assert h.clean_span.length == 3 * 4
    spans = [h.register_span, h.anchor_span, h.text_span, h.noised_span, h.clean_span]
    for before, after in zip(spans, spans[1:]):
        assert after.start == before.start + before.length
    assert spans[-1].start + spans[-1].length == tokens
    assert r.layout_key == h.layout_key != ""
    assert r.compute_us > 0 and r.total_us >= r.compute_us
    assert np.isfinite(r.tensors["velocity"]).all()


def test_step_equals_cpp_client(server, client, tmp_path):
    inputs = tiny_inputs(seed=1)
    file_inputs = {k: v for k, v in inputs.items() if k != "frames_per_chunk"}
    file_inputs["frames_per_chunk"] = np.array([inputs["frames_per_chunk"]], dtype=np.int64)
    save_file(file_inputs, str(tmp_path / "in.safetensors"))
    r = subprocess.run([CLI, "step", f"--address={server.address}",
                        f"--inputs={tmp_path / 'in.safetensors'}",
                        f"--out={tmp_path / 'out.safetensors'}",
                        "--outputs=velocity,cond,taps,embeddings,positions",
                        "--wire_dtype=float32"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r
    cpp = load_file(str(tmp_path / "out.safetensors"))
    py = client.step(**inputs, outputs=ALL_OUTPUTS).tensors
    assert sorted(cpp) == sorted(py) == sorted(ALL_NAMES)
    for name in ALL_NAMES:
        assert cpp[name].dtype == py[name].dtype, name
        assert np.array_equal(cpp[name], py[name]), name


def test_a_whole_answer_is_one_message_and_equals_the_stream(server, client):
    inputs = tiny_inputs(seed=3)
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_stream("/praxis.v1.Praxis/Step",
                                    request_serializer=pb.StepRequest.SerializeToString,
                                    response_deserializer=pb.StepResponse.FromString)
        for whole in (True, False):
            request = make_request(**inputs, outputs=ALL_OUTPUTS, whole_answer=whole)
            kinds = [m.WhichOneof("kind") for m in call(request, timeout=60)]
            assert kinds[0] == ("answer" if whole else "header") and len(kinds) == (
                1 if whole else 2 + len(ALL_NAMES)), kinds
    whole = client.step(**inputs, outputs=ALL_OUTPUTS)
    streamed = client.step(**inputs, outputs=ALL_OUTPUTS, whole_answer=False)
    for name in ALL_NAMES:
        assert np.array_equal(whole.tensors[name], streamed.tensors[name]), name


def test_bfloat16_wire_dtype(client):
    inputs = tiny_inputs(seed=2)
    full = client.step(**inputs, outputs=ALL_OUTPUTS).tensors
    bf16 = client.step(**inputs, outputs=ALL_OUTPUTS, wire_dtype="bfloat16").tensors
    for name in ALL_NAMES:
        if name == "positions":
            assert bf16[name].dtype == np.int64
            assert np.array_equal(bf16[name], full[name])
            continue
        assert bf16[name].dtype == np.float32, name
        assert not (bf16[name].view(np.uint32) & 0xFFFF).any(), name
        assert np.array_equal(bf16[name], to_bfloat16(full[name])), name
    half = client.step(**inputs, wire_dtype="float16").tensors["velocity"]
    assert half.dtype == np.float16
    assert np.array_equal(half, full["velocity"].astype(np.float16))


@pytest.mark.parametrize("change, field", [
    ({"frames_per_chunk": 0}, "frames_per_chunk"),
    ({"text": np.zeros((1, 5, 47), np.float32)}, "text"),
])
def test_malformed_request(client, change, field):
    with pytest.raises(PraxisError) as e:
        client.step(**{**tiny_inputs(), **change})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.message.startswith(field), e.value.message


def test_session(client):
    first, third = tiny_inputs(seed=3), tiny_inputs(seed=4, k=1, h=2, w=2)
    outputs = ["velocity", "tap.1"]
    with client.session(timeout=60) as s:
        a = s.step(**first, outputs=outputs, request_id="first")
        with pytest.raises(StepFailed) as e:
            s.step(**{**first, "frames_per_chunk": 0}, request_id="second")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.message.startswith("frames_per_chunk"), e.value.message
        c = s.step(**third, outputs=outputs, request_id="third")
        s.close()
    assert (a.header.request_id, c.header.request_id) == ("first", "third")
    for result, inputs in ((a, first), (c, third)):
        alone = client.step(**inputs, outputs=outputs)
        assert list(result.tensors) == ["velocity", "tap.1"]
        for name in result.tensors:
            assert np.array_equal(result.tensors[name], alone.tensors[name]), name


def test_a_session_sends_its_text_once():
    """The server keeps a session's text (text_kept); the client leaves an equal text out of the
    next steps, which are answered as if it were sent, and sends a new one in full."""
    server = Server("--metrics_port=0")
    try:
        same = [tiny_inputs(seed=20), tiny_inputs(seed=21), tiny_inputs(seed=22)]
        for inputs in same[1:]:
            inputs["text"] = same[0]["text"]
        other = tiny_inputs(seed=23, text_len=7)
        text_bytes = same[0]["text"].nbytes
        with Client(server.address) as c:
            with c.session(timeout=60) as s:
                received, results = [], []
                for inputs in same + [other]:
                    before = metric(server.metrics(), "praxis_received_bytes_total")
                    results.append(s.step(**inputs, outputs=["velocity"]))
                    received.append(metric(server.metrics(), "praxis_received_bytes_total") - before)
                assert metric(server.metrics(), "praxis_session_text_bytes") == other["text"].nbytes
            for inputs, result in zip(same + [other], results):
                assert result.header.text_kept
                alone = c.step(**inputs, outputs=["velocity"])
                assert np.array_equal(result.tensors["velocity"], alone.tensors["velocity"])
        assert received[1] < received[0] - text_bytes and received[2] < received[0] - text_bytes
        assert received[3] > other["text"].nbytes, "a new text is sent"
    finally:
        server.stop()


def header(*tensors):
    """A StepResponse header announcing float32 tensors of (name, element count)."""
    return pb.StepResponse(header=pb.StepHeader(tensors=[
        pb.TensorHeader(name=n, dtype=pb.FLOAT32, shape=[count], nbytes=4 * count)
        for n, count in tensors]))


def chunk(name, offset, data):
    return pb.StepResponse(chunk=pb.TensorChunk(name=name, offset=offset, data=data))


TRAILER = pb.StepResponse(trailer=pb.StepTrailer(total_us=7))
A = np.arange(4, dtype="<f4").tobytes()  # 16 bytes: tensor "a" of 4 floats
B = np.arange(2, dtype="<f4").tobytes()  # 8 bytes: tensor "b" of 2 floats


def test_assembler_accepts_a_well_formed_stream():
    r = assemble([header(("a", 4), ("empty", 0), ("b", 2)), chunk("a", 0, A[:10]),
                  chunk("a", 10, A[10:]), chunk("b", 0, B), TRAILER])
    assert list(r.tensors) == ["a", "empty", "b"]
    assert np.array_equal(r.tensors["a"], np.arange(4, dtype=np.float32))
    assert r.tensors["empty"].shape == (0,)
    assert np.array_equal(r.tensors["b"], np.arange(2, dtype=np.float32))
    assert r.total_us == 7


def answer(*messages):
    """The stream's messages as one StepAnswer."""
    a = pb.StepAnswer()
    for m in messages:
        kind = m.WhichOneof("kind")
        if kind == "chunk":
            a.chunks.append(m.chunk)
        else:
            getattr(a, kind).CopyFrom(getattr(m, kind))
    return pb.StepResponse(answer=a)


def test_assembler_accepts_a_whole_answer():
    r = assemble([answer(header(("a", 4), ("empty", 0), ("b", 2)), chunk("a", 0, A[:10]),
                         chunk("a", 10, A[10:]), chunk("b", 0, B), TRAILER)])
    assert list(r.tensors) == ["a", "empty", "b"]
    assert np.array_equal(r.tensors["b"], np.arange(2, dtype=np.float32))
    assert r.total_us == 7


@pytest.mark.parametrize("messages, error", [
    ([header(("a", 4)), chunk("a", 0, A[:8]), chunk("a", 12, A[12:]), TRAILER], "offset 12"),
    ([header(("a", 4)), chunk("a", 0, A[:8]), chunk("a", 0, A[:8]), TRAILER], "offset 0"),
    ([header(("a", 4), ("b", 2)), chunk("b", 0, B), chunk("a", 0, A), TRAILER], "chunk of b"),
    ([header(("a", 4)), chunk("a", 0, A[:12]), TRAILER], "12 of 16 bytes"),
    ([header(("a", 4), ("b", 2)), chunk("a", 0, A), TRAILER], "0 of 8 bytes"),
    ([header(("a", 4)), chunk("a", 0, A + B), TRAILER], "exceed"),
    ([header(("a", 4)), chunk("a", 0, A), chunk("a", 16, B), TRAILER], "after every tensor"),
    ([chunk("a", 0, A), TRAILER], "before the header"),
    ([header(("a", 4)), header(("a", 4))], "second header"),
    ([header(("a", 4)), chunk("a", 0, A)], "without a trailer"),
    ([header(("a", 4)), chunk("a", 0, A), TRAILER, TRAILER], "after the trailer"),
    ([pb.StepResponse()], "empty StepResponse"),
    ([answer(chunk("a", 0, A), TRAILER)], "without its header"),
    ([answer(header(("a", 4)), chunk("a", 0, A))], "without its header or trailer"),
    ([answer(header(("a", 4), ("b", 2)), chunk("a", 0, A), TRAILER)], "0 of 8 bytes"),
    ([answer(header(("a", 4)), chunk("a", 0, A + B), TRAILER)], "exceed"),
    ([header(("a", 4)), answer(header(("a", 4)), chunk("a", 0, A), TRAILER)], "second header"),
    ([answer(header(("a", 4)), chunk("a", 0, A), TRAILER), TRAILER], "after the trailer"),
])
def test_assembler_rejects(messages, error):
    with pytest.raises(ProtocolError, match=error) as e:
        assemble(messages)
    assert e.value.code == grpc.StatusCode.DATA_LOSS


def test_assembler_step_error():
    error = pb.StepResponse(error=pb.StepError(code=3, message="text: bad"))
    with pytest.raises(StepFailed) as e:
        assemble([error])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.message == "text: bad"
