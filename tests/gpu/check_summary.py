"""Checks the summary.json of `scripts/gpu-check.sh OUTDIR --cpu` (CTest gpu_check_cpu): every key
the device's summary will have, every stage exited 0, no test failed, and the figures are numbers.
"""

import json
import sys


def main(path):
    with open(path) as f:
        s = json.load(f)
    for key in ("mode", "gpu", "versions", "stages", "parity", "bench", "served", "cuda_graphs",
                "elapsed_s"):
        assert key in s, f"summary.json lacks {key}"
    assert s["mode"] == "cpu", s["mode"]
    # On the CPU steps run eagerly: no graph timings, and the server exposes no graph metrics.
    assert s["cuda_graphs"] == {"bench": {}, "served_metrics": {}}, s["cuda_graphs"]
    stages = {"gpu_test", "bench_tiny_sparse", "bench_tiny_dense", "bench_bench_sparse",
              "bench_bench_dense", "server_start", "load_small_1", "load_small_8", "server_exit"}
    assert set(s["stages"]) == stages, s["stages"]
    assert all(rc == 0 for rc in s["stages"].values()), s["stages"]
    parity = s["parity"]
    assert parity["tests"] >= 4 and parity["failures"] == 0, parity
    assert parity["skipped"] == parity["tests"], "without CUDA every GPU test skips"
    assert set(s["bench"]) == {"tiny", "bench"}, list(s["bench"])
    for name, bench in s["bench"].items():
        assert bench["gemm_bf16"]["tflops"] > 0, name
        for mode in ("sparse", "dense"):
            layout = bench["attention"][mode]["layouts"]["small"]
            assert layout["p50_ms"] > 0 and layout["useful_tflops"] > 0, (name, mode, layout)
            assert bench["attention"][mode]["memory"]["peak_bytes"] > 0, (name, mode)
    assert list(s["served"]["layouts"]) == ["small"], s["served"]
    small = s["served"]["layouts"]["small"]
    for callers in ("1", "8"):
        load = small[callers]
        assert load["ok"] > 0 and load["errors"] == 0, (callers, load)
        assert 0 < load["p50_ms"] <= load["p99_ms"], (callers, load)
    assert small["batching_8_over_1"] > 0, small
    metrics = s["served"]["server_metrics"]
    assert metrics["praxis_batch_rows_count"] > 0 and metrics["praxis_batch_rows_sum"] > 0, metrics
    assert "praxis_pipelined_answers_total" in metrics, metrics
    assert s["versions"]["torch_python"] is None or "2.11.0" in s["versions"]["torch_python"]
    print(f"{path}: every key present, {len(stages)} stages exited 0")


if __name__ == "__main__":
    main(sys.argv[1])
