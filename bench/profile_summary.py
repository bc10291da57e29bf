#!/usr/bin/env python3
"""Self time by operator of a chrome trace from step_bench --profile: where a step spends its time.

    profile_summary.py TRACE.json [--top 25]

LibTorch's legacy profiler (step_bench's) keeps each thread's begin and end records in a vector of
1 024 that doubles when full, copying what it holds: the op whose end is the 1 025th (2 049th, ...)
record carries that copy, 0.05-0.25 ms at a step's ~1 000 records (stop 56). Such ops are named
in a note under the table, so that one outlier is not read as the op's own time.
"""

import argparse
import collections
import json


def self_times(events: list[dict]) -> dict[str, list[float]]:
    """name -> [self µs, calls]: an op's duration minus the ops nested in it on the same thread."""
    spans = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    stack: list[dict] = []
    for e in spans:
        while stack and (stack[-1]["tid"] != e["tid"] or stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]):
            stack.pop()
        if stack:
            totals[stack[-1]["name"]][0] -= e["dur"]
        totals[e["name"]][0] += e["dur"]
        totals[e["name"]][1] += 1
        stack.append(e)
    return totals


def growth_points(events: list[dict]) -> list[tuple[int, str, float]]:
    """(tid, op, µs) of each op whose end was recorded as the profiler's event list grew."""
    records: dict[int, list[tuple[float, int, dict]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            records[e["tid"]] += [(e["ts"], 0, e), (e["ts"] + e["dur"], 1, e)]
    found = []
    for tid, rs in records.items():
        rs.sort(key=lambda r: (r[0], r[1]))
        at = 1024
        while at < len(rs):
            ts, is_end, e = rs[at]
            if is_end:
                found.append((tid, e["name"], e["dur"]))
            at *= 2
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    with open(a.trace, encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    totals = self_times(events)
    whole = sum(t for t, _ in totals.values())
    print(f"{'op':48} {'self ms':>9} {'share':>6} {'calls':>6}")
    for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"{name[:48]:48} {t / 1e3:9.2f} {t / whole:6.1%} {n:6d}")
    print(f"{'all ops':48} {whole / 1e3:9.2f}")
    for tid, name, dur in growth_points(events):
        print(f"note: {name} (thread {tid}, {dur / 1e3:.2f} ms) includes the profiler's own event-list growth")
    inclusive: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and e["name"].startswith("praxis::"):
            inclusive[e["name"]] += e["dur"]
    if inclusive:
        print(f"\n{'praxis:: scope (inclusive)':48} {'ms':>9} {'share':>6}")
        for name, t in sorted(inclusive.items(), key=lambda kv: -kv[1]):
            print(f"{name:48} {t / 1e3:9.2f} {t / whole:6.1%}")


if __name__ == "__main__":
    main()
