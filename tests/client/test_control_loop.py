"""praxis-load's control-loop mode (--robots, --find_max_robots) against the real praxis-server on
the embedded tiny model (issue 15).

Environment as test_cli_load.py's (set by CTest). The runs are a few seconds each. Timing on a
shared CI machine is noisy, so a feasible run checks the report's consistency (goodput and
starvation agree call by call, robot by robot) rather than a goodput of exactly 1; an impossible
rate must show goodput < 1 and starvation > 0.
"""
import json
import os
import subprocess

import pytest

SRC = os.environ.get("PRAXIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
LOAD = os.environ.get("PRAXIS_LOAD_BIN", os.path.join(SRC, "build", "client", "praxis-load"))

DISTRIBUTIONS = ["control_call_latency", "message_latency", "message_send_delay",
                 "message_service_time", "server_queue_time", "server_compute_time",
                 "message_other_time", "server_batch_rows", "robot_starvation_time"]
STAT_FIELDS = ["unit", "count", "avg", "min", "max", "std", "p1", "p5", "p10", "p25", "p50",
               "p75", "p90", "p95", "p99", "p99.9"]
ORDERED = ["min", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "p99.9", "max"]
SCALARS = ["goodput", "control_call_count", "on_time_call_count", "late_call_count",
           "failed_call_count", "skipped_call_count", "message_count", "error_message_count",
           "first_call_failure_count", "control_call_throughput", "forward_throughput",
           "starvation_time_total", "starvation_fraction", "benchmark_duration"]


def control_run(tmp_path, address, *flags, timeout=180):
    report = tmp_path / "control.json"
    r = subprocess.run([LOAD, f"--address={address}", "--warmup=300ms", f"--json={report}",
                        "--progress_interval=500ms", *flags],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    assert "Control loop:" in r.stdout and "goodput" in r.stdout, r.stdout
    return json.loads(report.read_text()), r


def scalar(j, name):
    return j[name]["avg"]


def check_schema_and_consistency(j):
    """Every documented field present; counts, goodput and starvation agree with each other."""
    for name in SCALARS:
        assert set(j[name]) == {"unit", "avg"}, name
    for name in DISTRIBUTIONS:
        stats = j[name]
        assert sorted(stats) == sorted(STAT_FIELDS), name
        if stats["count"] > 0:
            values = [stats[f] for f in ORDERED]
            assert values == sorted(values), (name, values)
    calls = scalar(j, "control_call_count")
    fates = [scalar(j, f"{f}_call_count") for f in ("on_time", "late", "failed", "skipped")]
    assert calls > 0 and sum(fates) == calls
    assert scalar(j, "goodput") == pytest.approx(fates[0] / calls)
    robots = j["robots"]
    assert len(robots) == j["input_config"]["robots"]
    assert sum(r["calls"] for r in robots) == calls
    assert sum(r["on_time"] for r in robots) == fates[0]
    total = sum(r["starvation_s"] for r in robots)
    assert scalar(j, "starvation_time_total") == pytest.approx(total, abs=1e-6)
    # The model: a robot starves exactly when one of its calls was not on time.
    for r in robots:
        assert (r["starvation_s"] > 0) == (r["on_time"] < r["calls"]), r
    assert (scalar(j, "starvation_time_total") > 0) == (scalar(j, "goodput") < 1)
    window = scalar(j, "benchmark_duration")
    assert scalar(j, "starvation_fraction") == pytest.approx(total / (window * len(robots)))
    split = j["server_time_split"]
    if j["message_service_time"]["count"] > 0:
        assert split["queue"] + split["compute"] + split["other"] == pytest.approx(1)
        assert split["compute"] > 0
    assert sum(e["count"] for e in j["error_summary"]) == scalar(j, "error_message_count")
    return calls


def test_batched_passes_on_sessions(server, tmp_path):
    j, r = control_run(tmp_path, server.address, "--robots=2", "--duration=3s", "--seed=5",
                       "--mix=16,4,4,2,1*3;8,2,2,1,1*1")
    calls = check_schema_and_consistency(j)
    info = j["input_config"]
    assert info["random_seed"] == 5 and "--robots=2" in info["cli_command"]
    assert info["pass_mode"] == "batched" and info["transport"] == "session"
    assert info["buffer_period_s"] == pytest.approx(24 / 15)
    assert {x["layout"] for x in j["robots"]} <= {"16,4,4,2,1", "8,2,2,1,1"}
    # 2 robots for 3 s at one call per 1.6 s: 3 or 4 measured calls.
    assert 3 <= calls <= 4, calls
    assert scalar(j, "on_time_call_count") > 0   # a 1.6 s budget for 4 tiny forwards
    sent = calls - scalar(j, "skipped_call_count")
    # Batched: one message of 2 rows per step; every one ran in a batch of at least its rows.
    assert scalar(j, "message_count") == 2 * sent
    assert j["server_batch_rows"]["min"] >= 2
    assert j["message_latency"]["count"] == scalar(j, "message_count") - scalar(
        j, "error_message_count")
    assert "calls" in r.stderr and "goodput" in r.stderr   # the progress line


def test_separate_passes_on_unary_calls(server, tmp_path):
    j, _ = control_run(tmp_path, server.address, "--robots=2", "--duration=2s",
                       "--pass_mode=separate", "--transport=unary")
    calls = check_schema_and_consistency(j)
    assert j["input_config"]["pass_mode"] == "separate"
    assert j["input_config"]["transport"] == "unary"
    sent = calls - scalar(j, "skipped_call_count")
    # Separate: one message per pass and step, each of one row.
    assert scalar(j, "message_count") == 2 * 2 * sent
    assert j["server_batch_rows"]["min"] >= 1


def test_separate_passes_on_sessions(server, tmp_path):
    j, _ = control_run(tmp_path, server.address, "--robots=1", "--duration=2s",
                       "--pass_mode=separate", "--steps=3")
    calls = check_schema_and_consistency(j)
    sent = calls - scalar(j, "skipped_call_count")
    assert scalar(j, "message_count") == 3 * 2 * sent


def test_impossible_rate_starves(server, tmp_path):
    """1 action per chunk at 1 kHz: a 1 ms budget for 4 forwards that take milliseconds each."""
    j, _ = control_run(tmp_path, server.address, "--robots=2", "--duration=2s", "--hz=1000",
                       "--chunk_actions=1")
    check_schema_and_consistency(j)
    assert scalar(j, "goodput") < 1
    assert scalar(j, "starvation_time_total") > 0
    assert all(r["starvation_s"] > 0 for r in j["robots"])
    # Calls whose window passed while the robot waited were skipped, not queued up: a robot
    # sends at most 2 periods (2 ms) late, plus scheduling noise; queued, it would fall seconds
    # behind.
    assert scalar(j, "skipped_call_count") > 0
    assert j["message_send_delay"]["max"] < 100


def test_find_max_robots_reaches_the_cap(server, tmp_path):
    # A target any served call meets, over probes long enough for a few calls per robot: the test
    # is about the search's course, and on a CI machine building an image beside it one call of a
    # 2 s probe was late (goodput 0 < 0.5) and the search stopped at 1.
    j, r = control_run(tmp_path, server.address, "--find_max_robots", "--max_robots=2",
                       "--duration=4s", "--goodput_target=0.01")
    search = j["max_robots_search"]
    assert [p["robots"] for p in search["probes"]] == [1, 2]
    assert search["max_robots"] == 2 and search["capped"] and search["cap"] == 2
    assert j["input_config"]["robots"] == 2     # the report is the largest passing probe's
    check_schema_and_consistency(j)
    assert "probing 2 robot(s)" in r.stderr


def test_find_max_robots_finds_none_at_an_impossible_rate(server, tmp_path):
    j, _ = control_run(tmp_path, server.address, "--find_max_robots", "--robots=2",
                       "--max_robots=8", "--duration=1s", "--hz=1000", "--chunk_actions=1")
    search = j["max_robots_search"]
    assert [p["robots"] for p in search["probes"]] == [2, 1]
    assert search["max_robots"] == 0 and not search["capped"]
    assert all(p["goodput"] < 0.99 for p in search["probes"])


@pytest.mark.parametrize("flags,named", [
    (["--robots=2", "--pass_mode=both"], "--pass_mode"),
    (["--robots=2", "--transport=rest"], "--transport"),
    (["--robots=2", "--hz=0"], "--hz"),
    (["--robots=2", "--chunk_actions=0"], "--chunk_actions"),
    (["--robots=2", "--duration=1s"], "--duration"),       # shorter than the 1.6 s buffer
    (["--robots=2", "--rate=5"], "--rate"),
    (["--robots=-1"], "--robots"),
    (["--find_max_robots", "--robots=8", "--max_robots=4"], "--max_robots"),
    (["--find_max_robots", "--goodput_target=2"], "--goodput_target"),
])
def test_bad_flags_are_named(server, flags, named):
    r = subprocess.run([LOAD, f"--address={server.address}", *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and named in r.stderr, (r.returncode, r.stderr)
