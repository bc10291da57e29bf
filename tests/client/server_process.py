"""praxis-server as a child process, and tiny-model inputs, for the client tests."""
import os
import re
import signal
import subprocess

import numpy as np
from safetensors.numpy import save_file

SRC = os.environ.get("PRAXIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.environ.get("PRAXIS_SERVER_BIN", os.path.join(SRC, "build", "server", "praxis-server"))


class Server:
    """praxis-server on 127.0.0.1:0 with the embedded tiny model; stopped with SIGTERM.

    Flags given override the defaults here (the last of a flag wins); with --metrics_port=0 the
    port /metrics is served on is `metrics_port`.
    """

    def __init__(self, *flags):
        self.proc = subprocess.Popen(
            [SERVER, "--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--threads=2", *flags],
            stdout=subprocess.PIPE, text=True)
        for line in self.proc.stdout:
            m = re.search(r"serving on [\d.]+:(\d+) metrics (\d+|off)", line)
            if m:
                self.address = f"127.0.0.1:{m.group(1)}"
                self.metrics_port = None if m.group(2) == "off" else int(m.group(2))
                return
        raise RuntimeError(f"praxis-server exited with {self.proc.wait()} before serving")

    def stop(self):
        """SIGTERM, and the drain must end with exit status 0."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0


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
