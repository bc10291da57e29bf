#!/usr/bin/env python3
"""Self time by operator of a chrome trace from step_bench --profile: where a step spends its time.

    profile_summary.py TRACE.json [--top 25]
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
