#!/usr/bin/env python3
"""Speed-ups over Random in rounds and in virtual seconds, per method, from results/ CSVs.

The time-to-accuracy rule of docs/results.md: per seed, s = T(Random) / T(method) on the
same data and devices; the geometric mean of s with a 95 % t-interval on log s. A method
keeps its round gain when both its rounds and its time intervals lie above 1, loses it when
only the rounds interval does, and otherwise had no round gain to keep. Censored seeds enter
at their bound (the run's last round or clock reading) and are counted in the table.

    python3 scripts/tta_speedups.py results/tta-fmnist-2spc.csv [--baseline uniform]

Standard library only, so it runs wherever the repository does.
"""

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict

# Two-sided 95 % Student t quantiles t(0.975, df), df = 1..30.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def interval(logs):
    """The geometric mean of exp(logs) and its 95 % t-interval; None below 2 values."""
    n = len(logs)
    if n < 2:
        return None
    if n - 1 > len(T975):
        sys.exit(f"{n} seeds: extend T975 beyond df = {len(T975)}")
    m = statistics.fmean(logs)
    half = T975[n - 2] * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def verdict(rounds, time):
    above = lambda ci: ci is not None and ci[1] > 1.0
    if above(rounds) and above(time):
        return "keeps its round gain"
    if above(rounds):
        return "loses its round gain"
    return "no round gain to keep"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--baseline", default="uniform")
    args = ap.parse_args()
    # (setting, metric, method) -> seed -> (value, censored)
    cells = defaultdict(dict)
    for path in args.csv:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["setting"], r["metric"], r["method"])
                cells[key][int(r["seed"])] = (float(r["value"]), r["censored"] == "true")
    settings = sorted({k[0] for k in cells})
    methods = []
    for k in cells:
        if k[2] != args.baseline and k[2] not in methods:
            methods.append(k[2])
    print("| setting | method | seeds | rounds speed-up (95 % CI) | time speed-up (95 % CI) "
          "| censored (method / Random) | verdict |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda ci: "N/A" if ci is None else f"{ci[0]:.3f} ({ci[1]:.3f}–{ci[2]:.3f})"
    for s in settings:
        for m in methods:
            out = {}
            cens = ""
            for metric in ("rounds_to_target", "time_to_target_s"):
                a = cells.get((s, metric, m), {})
                b = cells.get((s, metric, args.baseline), {})
                seeds = sorted(set(a) & set(b))
                logs = [math.log(b[k][0] / a[k][0]) for k in seeds]
                out[metric] = (interval(logs), len(seeds))
                if metric == "time_to_target_s":
                    cens = f"{sum(a[k][1] for k in seeds)} / {sum(b[k][1] for k in seeds)}"
            (r, n), (t, _) = out["rounds_to_target"], out["time_to_target_s"]
            print(f"| {s} | {m} | {n} | {fmt(r)} | {fmt(t)} | {cens} | {verdict(r, t)} |")


if __name__ == "__main__":
    main()
