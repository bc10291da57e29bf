"""praxis-cli and praxis-load against the real praxis-server (issue 5).

Environment (set by CTest): PRAXIS_SERVER_BIN, PRAXIS_CLI_BIN, PRAXIS_LOAD_BIN, PRAXIS_FORWARD_BIN,
PRAXIS_SOURCE_DIR. Each test fails, never skips, when a binary is missing.
"""
import json
import os
import re
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file
from server_process import Server, metric, save_inputs

SRC = os.environ.get("PRAXIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(SRC, "build")
CLI = os.environ.get("PRAXIS_CLI_BIN", os.path.join(BUILD, "client", "praxis-cli"))
LOAD = os.environ.get("PRAXIS_LOAD_BIN", os.path.join(BUILD, "client", "praxis-load"))
FORWARD = os.environ.get("PRAXIS_FORWARD_BIN", os.path.join(BUILD, "tools", "praxis-forward"))


def run(*args, timeout=120):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def test_cli_health_and_info(server):
    r = run(CLI, "health", f"--address={server.address}")
    assert r.returncode == 0 and r.stdout.strip() == "SERVING", r
    r = run(CLI, "info", f"--address={server.address}")
    assert r.returncode == 0, r
    assert "dtype: float32" in r.stdout and "tap.1" in r.stdout
    # What the server's CPU implies for float32, as its start-up line says it.
    compute = next(line for line in r.stdout.splitlines() if line.startswith("compute: "))
    compute = compute[len("compute: "):]
    assert "float32" in compute and compute in server.log(), (compute, server.log())


def test_cli_step_equals_in_process_forward(server, tmp_path):
    """The outputs file of `praxis-cli step` equals praxis-forward on the same (embedded) model.

    Equal to float32 rounding, not bit for bit: two processes split LibTorch's matmuls across
    their threads differently (praxis-forward with 1 and with 2 threads already differs by 1e-6).
    Bit-exactness within one process is tests/server/server_model_test.cc's.
    """
    inputs, served, local = tmp_path / "in.st", tmp_path / "served.st", tmp_path / "local.st"
    save_inputs(str(inputs), k=3, f=1, h=4, w=2, text_len=7)
    r = run(CLI, "step", f"--address={server.address}", f"--inputs={inputs}", f"--out={served}")
    assert r.returncode == 0, r.stderr
    r = run(FORWARD, f"--config={SRC}/configs/tiny.json", "--seed=0", "--threads=2",
            f"--inputs={inputs}", f"--out={local}")
    assert r.returncode == 0, r.stderr
    got, want = load_file(str(served)), load_file(str(local))
    assert sorted(got) == sorted(want) == sorted(
        ["velocity", "cond", "tap.0", "tap.1", "embeddings", "positions"])
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert np.allclose(got[name], want[name], rtol=0, atol=1e-5), name


def test_cli_step_synthetic_layout_and_bad_input(server, tmp_path):
    out = tmp_path / "out.st"
    r = run(CLI, "step", f"--address={server.address}", "--layout=6,2,3,2,2", "--batch=2",
            "--outputs=velocity,tap.1", "--wire_dtype=bfloat16", f"--out={out}")
    assert r.returncode == 0, r.stderr
    import safetensors.torch  # numpy has no bfloat16
    import torch
    t = safetensors.torch.load_file(str(out))
    assert sorted(t) == ["tap.1", "velocity"]
    assert t["velocity"].dtype == torch.bfloat16
    assert tuple(t["velocity"].shape) == (2, 16, 4, 2, 3)
    r = run(CLI, "step", f"--address={server.address}", "--layout=6,2,3,2,2",
            "--frames_per_chunk=3", f"--out={out}")
    assert r.returncode == 1 and "frames_per_chunk" in r.stderr, r   # the server refused it
    r = run(CLI, "step", f"--address={server.address}", "--layout=6,2", f"--out={out}")
    assert r.returncode == 2 and "--layout" in r.stderr, r           # refused before sending
    r = run(CLI, "step", f"--address={server.address}", "--layout=6,2,3,2,2", f"--out={tmp_path}")
    assert r.returncode == 2 and "--out" in r.stderr and "directory" in r.stderr, r


def load_report(tmp_path, address, *flags):
    report = tmp_path / "report.json"
    csv = tmp_path / "report.csv"
    r = run(LOAD, f"--address={address}", "--warmup=300ms", f"--json={report}", f"--csv={csv}",
            "--progress_interval=500ms", *flags)
    assert r.returncode == 0, r.stderr
    assert "done" in r.stderr and "req/s" in r.stderr          # the progress line
    assert "Summary" in r.stdout and "Histogram" in r.stdout   # the final report
    j = json.loads(report.read_text())
    assert j["ok"] + j["errors"] == j["sent"]
    assert sum(j["codes"].values()) == j["sent"]
    assert sum(j["layouts"].values()) == j["sent"]
    rows = csv.read_text().strip().splitlines()
    assert rows[0].startswith("start_s,latency_ms,code") and len(rows) == j["sent"] + 1
    return j


def test_load_closed_loop(server, tmp_path):
    j = load_report(tmp_path, server.address, "--duration=2s", "--concurrency=4",
                    "--mix=16,4,4,2,1*3;8,2,2,1,1,enc*1")
    assert j["ok"] > 0 and j["errors"] == 0
    assert set(j["layouts"]) == {"16,4,4,2,1", "8,2,2,1,1,enc"}
    lat = j["latency_ms"]
    assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]


@pytest.mark.parametrize("mode", [("--concurrency=3",), ("--rate=30", "--max_in_flight=3")])
def test_load_over_sessions(tmp_path, mode):
    """--transport=session: every step of the run travels on a caller's Session, none as a Step."""
    s = Server("--metrics_port=0")
    try:
        j = load_report(tmp_path, s.address, "--duration=1s", "--transport=session", *mode)
        assert j["ok"] > 0 and j["errors"] == 0, j["codes"]
        page = s.metrics()
        # the run's steps, its warm-up's, and none as a unary call
        assert metric(page, "praxis_requests_total", code="OK", method="Session") >= j["ok"]
        assert metric(page, "praxis_requests_total", code="OK", method="Step") == 0
        r = run(LOAD, f"--address={s.address}", "--duration=1s", "--transport=stream")
        assert r.returncode != 0 and '--transport: expected session or unary, got "stream"' in r.stderr
    finally:
        s.stop()


def test_load_open_loop_with_a_request_budget(server, tmp_path):
    j = load_report(tmp_path, server.address, "--duration=20s", "--rate=40",
                    "--arrival=constant", "--requests=30")
    assert j["sent"] == 30 and j["ok"] == 30
    assert j["elapsed_s"] < 20   # ended by the request budget, not the duration


def test_load_shows_induced_errors(tmp_path):
    """A one-request queue and a tight deadline make the server refuse; the report counts it."""
    s = Server("--max_queue_requests=1", "--max_queue_delay=50ms")
    try:
        j = load_report(tmp_path, s.address, "--duration=2s", "--concurrency=6")
        assert j["codes"].get("RESOURCE_EXHAUSTED", 0) > 0, j["codes"]
        j = load_report(tmp_path, s.address, "--duration=1s", "--concurrency=2", "--timeout=1ms")
        assert j["codes"].get("DEADLINE_EXCEEDED", 0) > 0, j["codes"]
    finally:
        s.stop()


def test_server_answer_pipeline_flag():
    """--answer_pipeline: a bad value is refused naming the flag; the start-up line says which."""
    from server_process import SERVER
    r = run(SERVER, "--port=0", "--metrics_port=-1", "--answer_pipeline=maybe")
    assert r.returncode != 0 and "--answer_pipeline: expected auto, on or off" in r.stderr, r
    s = Server("--answer_pipeline=on")
    try:
        assert "answer_pipeline on" in s.log(), s.log()
    finally:
        s.stop()


def test_server_thread_probe():
    """--thread_probe_every: a negative value is refused naming the flag; a CPU server says in
    /metrics how many intra-op threads its steps ran on and how often that changed, and 0 keeps
    --threads."""
    from server_process import SERVER
    r = run(SERVER, "--port=0", "--metrics_port=-1", "--thread_probe_every=-1s")
    assert r.returncode != 0 and "--thread_probe_every must be >= 0, got -1s" in r.stderr, r
    for flags, threads in [(("--threads=1",), 1), (("--threads=2", "--thread_probe_every=0"), 2)]:
        s = Server("--metrics_port=0", "--metrics_host=127.0.0.1", *flags)
        try:
            page = s.metrics()  # after the warm-up steps
        finally:
            s.stop()
        assert f"praxis_intra_op_threads {threads}\n" in page, (flags, page)
        assert "praxis_intra_op_thread_switches_total 0\n" in page, (flags, page)


def metrics_after_load(tmp_path, server_flags, *load_flags):
    """A server's start-up log and /metrics page after 1 s of praxis-load (`load_flags`) on the
    small layout; the server runs with `server_flags` and is stopped."""
    s = Server("--metrics_port=0", "--metrics_host=127.0.0.1", *server_flags)
    try:
        load_report(tmp_path, s.address, "--duration=1s", "--mix=32,6,8,2,1", *load_flags)
        return s.log(), s.metrics()
    finally:
        s.stop()


def test_server_concurrent_batches(tmp_path):
    """--concurrent_batches: refused below 0 or above --threads, naming the flag; the start-up line
    says how many run at once; with batches queued behind each other, at 0 (2 on 2 threads) some
    run side by side (praxis_side_by_side_batches_total), at 1 none does."""
    from server_process import SERVER
    r = run(SERVER, "--port=0", "--metrics_port=-1", "--concurrent_batches=-1")
    assert r.returncode != 0 and "--concurrent_batches must be >= 0, got -1" in r.stderr, r
    r = run(SERVER, "--port=0", "--metrics_port=-1", "--threads=2", "--concurrent_batches=3")
    assert r.returncode != 0 and "--concurrent_batches must be at most --threads (2)" in r.stderr, r
    for flag, at_once in [("--concurrent_batches=0", 2), ("--concurrent_batches=1", 1)]:
        log, page = metrics_after_load(tmp_path, ("--threads=2", "--max_batch_size=1", flag),
                                       "--concurrency=8")
        assert f"concurrent_batches {at_once}" in log, log
        beside = re.search(r"^praxis_side_by_side_batches_total (\S+)$", page, re.M)
        assert beside and (float(beside.group(1)) > 0) == (at_once > 1), (flag, page)


def test_server_batch_rows_held_per_layout(tmp_path):
    """/metrics says, per layout the batch sizer has seen, the rows it holds that layout's batches
    to now (1 up to --max_batch_size); nothing with the sizer off (--batch_probe_every=0)."""
    for flags, sized in [((), True), (("--batch_probe_every=0",), False)]:
        _, page = metrics_after_load(tmp_path, ("--max_batch_size=4", *flags), "--concurrency=4")
        held = re.findall(r'^praxis_batch_rows_held\{layout="([^"]*)"\} (\S+)$', page, re.M)
        if not sized:
            assert held == [], (flags, held)
            continue
        assert [k for k, _ in held if k.startswith("L32_a6x8_K2_F1_")], (flags, held)
        assert all(1 <= float(v) <= 4 for _, v in held), (flags, held)


def test_server_batch_probe_every_refused_when_negative():
    """--batch_probe_every: a negative value is refused naming the flag (0 turns the sizer off)."""
    from server_process import SERVER
    r = run(SERVER, "--port=0", "--metrics_port=-1", "--batch_probe_every=-1")
    assert r.returncode != 0 and "--batch_probe_every must be >= 0, got -1" in r.stderr, r


def test_server_text_cache():
    """--text_cache_entries: a negative value is refused naming the flag; served steps that repeat
    an instruction reuse its projection (the metrics say so), and 0 turns the cache off."""
    from server_process import SERVER
    r = run(SERVER, "--port=0", "--metrics_port=-1", "--text_cache_entries=-1")
    assert r.returncode != 0 and "--text_cache_entries and --text_cache_bytes must be >= 0" in r.stderr, r

    def text_cache(*flags):
        s = Server("--metrics_port=0", "--metrics_host=127.0.0.1", *flags)
        try:
            # praxis-load sends one instruction per layout, as a robot does with every step.
            r = run(LOAD, f"--address={s.address}", "--requests=6", "--concurrency=1", "--warmup=0s",
                    "--mix=5,3,4,2,1")
            assert r.returncode == 0, r.stderr
            page = s.metrics()
        finally:
            s.stop()
        return {name: metric(page, name) for name in ("praxis_text_cache_hits_total",
                                                        "praxis_text_cache_misses_total",
                                                        "praxis_text_cache_entries")}

    on = text_cache()
    assert on["praxis_text_cache_misses_total"] >= 1 and on["praxis_text_cache_hits_total"] >= 5, on
    off = text_cache("--text_cache_entries=0")
    assert off == {"praxis_text_cache_hits_total": 0, "praxis_text_cache_misses_total": 0,
                   "praxis_text_cache_entries": 0}, off
