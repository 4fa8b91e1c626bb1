#!/usr/bin/env python3
"""The "Time to accuracy, all selectors" table of docs/results.md, from sweep directories.

Per strategy of a sweep (runs/NAME/cells/*/summary.json): the seeds, how many reached the
target, rounds and virtual seconds to the target (mean with a 95 % t-interval over seeds, and
the median), the speed-up in time over Random (per seed T(Random) / T(method) on the same
data and devices, geometric mean with a 95 % t-interval on the logs, over the seeds both ran),
the ledger's wasted trainings per run and the mean round length. A seed that never reached
the target enters at its bound (its last round, its last clock reading), as
scripts/tta_speedups.py and `fedsel results render` do, and the cell then reads "≥".

    python3 scripts/tta_all_table.py runs/tta-all-synthetic [--baseline uniform]

Standard library only.
"""

import argparse
import glob
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tta_speedups import T975, interval  # noqa: E402


def mean_ci(xs):
    """Mean and 95 % t-interval; None below 2 values."""
    n = len(xs)
    if n < 2:
        return None
    m = statistics.fmean(xs)
    half = T975[n - 2] * statistics.stdev(xs) / math.sqrt(n)
    return m, m - half, m + half


def cell(xs, censored, digits):
    ci = mean_ci(xs)
    if ci is None:
        return "N/A"
    f = lambda v: f"{v:,.{digits}f}"
    if censored:
        return f"≥ {f(ci[0])} ({censored} censored); median {f(statistics.median(xs))}"
    return f"{f(ci[0])} [{f(ci[1])}, {f(ci[2])}]; median {f(statistics.median(xs))}"


def load(sweep):
    """strategy -> seed -> (rounds, time, rounds_censored, time_censored, wasted, round_s)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(sweep, "cells", "*", "summary.json"))):
        s = json.load(open(path))
        if s.get("status") != "finished":
            continue
        rt, tt = s.get("rounds_to_target") or [], s.get("time_to_target_s") or []
        r = rt[0][1] if rt and rt[0][1] is not None else None
        t = tt[0][1] if tt and tt[0][1] is not None else None
        rounds = s["rounds"]
        out.setdefault(s["strategy"], {})[s["seed"]] = (
            r if r is not None else rounds,
            t if t is not None else s["clock_s"],
            r is None,
            t is None,
            s["wasted_trainings"],
            s["clock_s"] / rounds,
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--baseline", default="uniform")
    args = ap.parse_args()
    runs = load(args.sweep)
    base = runs.get(args.baseline, {})
    print("| strategy | seeds | reached | rounds to target | time to target (s) "
          "| time speed-up over Random (95 % CI) | wasted trainings a run | mean round (s) |")
    print("|---|---|---|---|---|---|---|---|")
    order = sorted(runs, key=lambda m: (m != args.baseline, m))
    for m in order:
        seeds = sorted(runs[m])
        v = [runs[m][k] for k in seeds]
        reached = sum(not x[3] for x in v)
        rounds = cell([x[0] for x in v], sum(x[2] for x in v), 1)
        time = cell([x[1] for x in v], sum(x[3] for x in v), 0)
        both = [k for k in seeds if k in base]
        sp = "—"
        if m != args.baseline:
            ci = interval([math.log(base[k][1] / runs[m][k][1]) for k in both])
            sp = "N/A" if ci is None else f"{ci[0]:.2f} ({ci[1]:.2f}–{ci[2]:.2f}), {len(both)} seeds"
        wasted = statistics.fmean(x[4] for x in v)
        rs = statistics.fmean(x[5] for x in v)
        print(f"| {m} | {len(seeds)} | {reached} | {rounds} | {time} | {sp} | {wasted:,.0f} | {rs:.1f} |")


if __name__ == "__main__":
    main()
