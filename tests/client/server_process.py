"""praxis-server as a child process, and tiny-model inputs, for the client tests.

The one harness that starts a server process in Python: the client, deploy and bench scripts all
start theirs through `Server` (bench/python_server.py too, which writes the same --port_file)."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from concurrent import futures

import numpy as np
from safetensors.numpy import save_file

SRC = os.environ.get("PRAXIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.environ.get("PRAXIS_SERVER_BIN", os.path.join(SRC, "build", "server", "praxis-server"))
# praxis-server's flags before those given to Server: loopback, ports picked by the kernel, no
# /metrics, and two intra-op threads.
DEFAULT_FLAGS = ("--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--threads=2")


class Server:
    """praxis-server on 127.0.0.1:0 with the embedded tiny model; stopped with SIGTERM.

    Flags given override DEFAULT_FLAGS (the last of a flag wins); with --metrics_port=0 the port
    /metrics is served on is `metrics_port`. `binary` is the program to start (a path, or a list
    such as [python, "bench/python_server.py"]; default PRAXIS_SERVER_BIN) and `default_flags` the
    flags it gets before --port_file and `flags`. Not thread-safe.
    """

    def __init__(self, *flags, timeout=120, binary=SERVER, default_flags=DEFAULT_FLAGS):
        self._dir = tempfile.mkdtemp(prefix="praxis-server-")
        port_file = os.path.join(self._dir, "port.json")
        self.log_path = os.path.join(self._dir, "log")
        program = [binary] if isinstance(binary, str) else list(binary)
        name = os.path.basename(program[-1])  # praxis-server, or python_server.py
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [*program, *default_flags, f"--port_file={port_file}", *flags],
                stdout=log, stderr=subprocess.STDOUT)
        # The server writes the file (atomically, by rename) once it is SERVING.
        deadline = time.monotonic() + timeout
        while not os.path.exists(port_file):
            if self.proc.poll() is not None:
                self._fail(f"{name} exited with {self.proc.returncode} before serving")
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                self._fail(f"{name} wrote no {port_file} within {timeout} s")
            time.sleep(0.02)
        with open(port_file) as f:
            ports = json.load(f)
        assert ports["pid"] == self.proc.pid, ports
        self.port = ports["port"]
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_port = ports["metrics_port"]  # None with --metrics_port=-1

    def _fail(self, why):
        with open(self.log_path) as f:
            log = f.read()
        shutil.rmtree(self._dir, ignore_errors=True)
        raise RuntimeError(f"{why}; its output:\n{log}")

    def metrics(self):
        """Its /metrics page (a server started with --metrics_port=0)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            return r.read().decode()

    def log(self):
        """What the server printed (stdout and stderr) so far."""
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        """SIGTERM, and the drain must end with exit status 0."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        log = self.log()
        shutil.rmtree(self._dir, ignore_errors=True)
        assert code == 0, log


def metric(page, name, **labels):
    """The value of `name`{labels} in a Prometheus text page (`Server.metrics()`); 0 when absent."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in page.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name and not want:
            return float(value)
        if head.startswith(name + "{") and ",".join(sorted(head[len(name) + 1:-1].split(","))) == want:
            return float(value)
    return 0.0


def tiny_inputs(seed=0, b=1, text_len=5, h=3, w=4, k=2, f=1):
    """Step arguments for the tiny model (C=16, text_dim=48)."""
    rng = np.random.default_rng(seed)
    inputs = {
        "text": rng.standard_normal((b, text_len, 48), dtype=np.float32),
        "anchor": rng.standard_normal((b, 16, 1, h, w), dtype=np.float32),
        "noised": rng.standard_normal((b, 16, k * f, h, w), dtype=np.float32),
        "timesteps": rng.random((b, k), dtype=np.float32),
        "frames_per_chunk": f,
    }
    if k > 1:
        inputs["clean"] = rng.standard_normal((b, 16, (k - 1) * f, h, w), dtype=np.float32)
    return inputs


def save_inputs(path, **layout):
    """tiny_inputs(**layout) as praxis-cli and praxis-forward read them."""
    t = tiny_inputs(**layout)
    t["frames_per_chunk"] = np.array([t["frames_per_chunk"]], dtype=np.int64)
    save_file(t, path)


@contextlib.contextmanager
def loopback_server(handler, workers):
    """A grpcio server on 127.0.0.1:0 serving `handler` (a GenericRpcHandler); sets
    handler.address and yields the handler, stopping the server afterwards."""
    import grpc  # only the fake-server tests need grpcio here
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), handlers=[handler])
    handler.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        yield handler
    finally:
        server.stop(0)
