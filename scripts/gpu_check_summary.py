"""The summary.json of scripts/gpu-check.sh (issue 14), from what its stages left in --work.

Keys: mode, gpu (nvidia-smi's name, driver, memory; null on cpu), versions, stages (exit status of
each), parity (gpu_test's cases from its XML), bench (gpu_bench's JSON per config), served (the
served config, PRAXIS_SERVER_FLAGS, per served layout praxis-load's figures at 1 and 8 callers,
and the server's batch metrics), cuda_graphs (gpu_bench's capture and eager-vs-graph p50 per
config and layout, and the served server's praxis_cuda_graph_* metrics
after the load; both empty on cpu, where steps run eagerly), elapsed_s. Prints it and
exits 1 when a stage failed or a test failed. Standard library only: the device's python3 has it.
"""

import argparse
import glob
import json
import os
import platform
import subprocess
import xml.etree.ElementTree as ET


def run(cmd):
    """The first line of cmd's output, or None if it cannot run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        return out.splitlines()[-1] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{os.path.basename(path)}: {e}"}


def parity(xml_path, log_path):
    """Counts and each case's result (passed, failed, skipped) from gtest's XML, and the measured
    difference of every compared output (the "[parity] " lines of gpu_test's stdout)."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as e:
        return {"error": str(e), "tests": 0, "failures": 0, "skipped": 0, "cases": {},
                "measured": []}
    cases = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        if case.find("failure") is not None:
            cases[name] = "failed"
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            cases[name] = "skipped"
        else:
            cases[name] = "passed"
    results = list(cases.values())
    try:
        with open(log_path) as f:
            measured = [line[len("[parity] "):].strip() for line in f
                        if line.startswith("[parity] ")]
    except OSError:
        measured = []
    return {"tests": len(results), "failures": results.count("failed"),
            "skipped": results.count("skipped"), "cases": cases, "measured": measured}


def bench(work):
    """gpu_bench's JSON per config, its attention modes (one run each) merged under "attention"."""
    out = {}
    for path in sorted(glob.glob(os.path.join(work, "bench_*.out"))):
        name, mode = os.path.basename(path)[len("bench_"):-len(".out")].rsplit("_", 1)
        j = read_json(path)
        entry = out.setdefault(name, {k: v for k, v in j.items() if k != "attention"})
        entry.setdefault("attention", {})[mode] = j.get("attention", {}).get(mode, j)
    return out


def served(work, config):
    """Per served layout (served_layouts.txt: name and layout per line), praxis-load's figures at
    1 and 8 callers, and the 8-caller throughput over the 1-caller one."""
    out = {"config": config, "server_flags": os.environ.get("PRAXIS_SERVER_FLAGS", ""),
           "layouts": {}}
    try:
        with open(os.path.join(work, "served_layouts.txt")) as f:
            entries = [line.split() for line in f if line.strip()]
    except OSError:
        entries = []
    for name, mix in entries:
        layout = out["layouts"][name] = {"layout": mix}
        for n in ("1", "8"):
            j = read_json(os.path.join(work, f"load_{name}_{n}.json"))
            lat = j.get("latency_ms", {})
            layout[n] = {"p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"), "ok": j.get("ok"),
                         "errors": j.get("errors"), "throughput_rps": j.get("throughput_rps"),
                         "server_compute_p50_ms": j.get("server_compute_ms", {}).get("p50")}
            if "error" in j:
                layout[n]["error"] = j["error"]
        one, eight = layout["1"]["throughput_rps"], layout["8"]["throughput_rps"]
        layout["batching_8_over_1"] = eight / one if one and eight else None
    # How full the batches were and where their time went: sums and counts over the whole served
    # run, every layout together.
    out["server_metrics"] = scraped(work, ("praxis_batch_rows_", "praxis_queue_seconds_sum",
                                           "praxis_queue_seconds_count",
                                           "praxis_compute_seconds_sum",
                                           "praxis_compute_seconds_count",
                                           "praxis_batch_phase_seconds_sum",
                                           "praxis_batch_phase_seconds_count",
                                           "praxis_pipelined_answers_total"))
    return out


def scraped(work, prefixes):
    """The served server's metrics (scraped after the load) whose names start with `prefixes`."""
    metrics = {}
    try:
        with open(os.path.join(work, "metrics.txt")) as f:
            for line in f:
                if line.startswith(prefixes):
                    key, value = line.split()[:2]
                    metrics[key] = float(value)
    except OSError:
        pass
    return metrics


def cuda_graphs(bench_out, work):
    """The sparse-attention graph timings of every bench config and layout, and the served
    server's graph metrics (scraped after the load)."""
    timings = {}
    for name, entry in bench_out.items():
        layouts = entry.get("attention", {}).get("sparse", {}).get("layouts", {})
        for layout, j in layouts.items():
            if isinstance(j, dict) and "cuda_graph" in j:
                timings.setdefault(name, {})[layout] = j["cuda_graph"]
    return {"bench": timings, "served_metrics": scraped(work, "praxis_cuda_graph_")}


def versions(args):
    torch = run(["python3", "-c", "import torch;print(torch.__version__, torch.version.cuda)"])
    pack = os.path.join(args.pack, "VERSION") if args.pack else ""
    return {"torch_python": torch, "server_binary": args.server,
            "git": run(["git", "-C", args.root, "rev-parse", "--short", "HEAD"]),
            "pack": open(pack).read().strip() if pack and os.path.exists(pack) else None,
            "nvcc": run(["nvcc", "--version"]), "glibc": platform.libc_ver()[1],
            "kernel": platform.release()}


def main():
    p = argparse.ArgumentParser()
    for flag in ("mode", "work", "out", "root", "pack", "elapsed", "server", "config"):
        p.add_argument("--" + flag, default="")
    args = p.parse_args()
    smi = run(["cat", os.path.join(args.work, "nvidia-smi.txt")])
    stages = {os.path.basename(f)[3:]: int(open(f).read().strip() or 1)
              for f in sorted(glob.glob(os.path.join(args.work, "rc.*")))}
    summary = {
        "mode": args.mode,
        "gpu": smi,
        "versions": versions(args),
        "stages": stages,
        "parity": parity(os.path.join(args.out, "gpu_test.xml"),
                         os.path.join(args.work, "gpu_test.out")),
        "bench": bench(args.work),
        "served": served(args.work, args.config),
        "elapsed_s": int(args.elapsed or 0),
    }
    summary["cuda_graphs"] = cuda_graphs(summary["bench"], args.work)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(json.dumps(summary, indent=2))
    failed = [s for s, rc in stages.items() if rc != 0]
    return 1 if failed or summary["parity"]["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
