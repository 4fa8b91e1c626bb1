"""fedsel against PyTorch in one sitting: the ratios bench/README.md reports (issue 12).

Absolute times move with the machine and its load, so the two sides are run alternately,
PAIRS times (PyTorch's scripts, then `fedsel bench`, then again), with the same number of
threads, and each workload's speed ratio (PyTorch's time / fedsel's) is the median of the
per-pair ratios. Needs a Python with CPU PyTorch (../shared/bench/setup-torch.sh makes one)
and a release build of the CLI.

Usage:
  python bench/compare.py [--fedsel target/release/fedsel] [--pairs 3] [--threads 2]
                          [--data-dir ../shared/data] [--rounds 30] [--quick]

`--quick` times the training steps and the FedCor round only (a pair takes minutes, not a
quarter of an hour): the evaluations of 10k examples and fedsel's comparisons with its
own burn paths are what make a full pair long.

Prints a Markdown table: workload, median PyTorch ms, median fedsel ms, speed ratio
(> 1: fedsel is faster) and the per-pair ratios. The FedCor round needs Fashion-MNIST
under DATA_DIR/fashion-mnist; without it that row is left out.
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return out.stdout


def torch_side(py, threads, fmnist, rounds, quick):
    """{workload: ms} from the three PyTorch references."""
    t = str(threads)
    times = {}
    cnn = [py, HERE / "torch_cnn.py", "--threads", t] + (["--steps-only"] if quick else [])
    for line in run(cnn).splitlines():
        fields = dict(re.findall(r"(\w+)=([\d.]+)", line))
        name = line.split()[0]
        times[f"step {name}"] = float(fields["step_ms"])
        if not quick:
            times[f"eval {name}"] = float(fields["eval10k_ms"])
    lstm = [py, HERE / "torch_reference.py", "--threads", t] + (["--eval-reps", "0"] if quick else [])
    line = run(lstm).strip()
    fields = dict(re.findall(r"(\w+)=([\d.]+)", line))
    times["step char_lstm"] = float(fields["ms_per_step"])
    if "eval_ms" in fields and not quick:
        times["eval char_lstm"] = float(fields["eval_ms"])
    if fmnist is not None:
        line = run([py, HERE / "torch_fedcor_round.py", fmnist, "--rounds", str(rounds),
                    "--threads", t])
        times["round fedcor"] = float(re.search(r"([\d.]+) ms/round", line).group(1))
    return times


def fedcor_round(binary, data_dir, rounds, env):
    """The FedCor round `fedsel bench` runs, without the per-client held-out accuracies
    (`eval.per_client`), which the PyTorch loop does not compute: ms per round after the
    same five warm-up rounds that torch_fedcor_round.py leaves out, from the run's
    `elapsed_s`: the mean of the later rounds, where the PyTorch loop takes their median,
    as the column's millisecond steps make a median of single rounds too coarse."""
    config = HERE.parent / "configs" / "fedcor" / "fmnist_2spc_rand.toml"
    warm_up = 5
    if rounds <= warm_up:
        sys.exit(f"--rounds must exceed the {warm_up} warm-up rounds")
    with tempfile.TemporaryDirectory() as out:
        run([binary, "run", str(config), "--set", f"rounds={rounds}", "--set", "eval.per_client=false",
             "--data-dir", data_dir, "--out", out + "/run"], env)
        with open(Path(out) / "run" / "metrics.csv", newline="") as f:
            elapsed = [float(row["elapsed_s"]) for row in csv.DictReader(f)]
    return 1000 * (elapsed[-1] - elapsed[warm_up - 1]) / (len(elapsed) - warm_up)


def fedsel_side(binary, threads, data_dir, rounds, quick, fmnist):
    """{workload: ms} from `fedsel bench` (fused paths where a model has one)."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    args = ["--steps-only"] if quick else ["--data-dir", data_dir, "--rounds", str(rounds)]
    out = run([binary, "bench", *args], env)
    times = {}
    for line in out.splitlines():
        if m := re.match(r"step\s+(\S+)\s+batch\s+\d+:\s+([\d.]+) ms", line):
            times[f"step {m.group(1)}"] = float(m.group(2))
        elif m := re.match(r"eval\s+(\S+) .*interleaved: ([\d.]+) ms vs", line):
            times[f"eval {m.group(1)}"] = float(m.group(2))
        elif m := re.match(r"round fedcor .*: ([\d.]+) ms/round", line):
            times["round fedcor"] = float(m.group(1))
    if quick and fmnist is not None:
        times["round fedcor"] = fedcor_round(binary, data_dir, rounds, env)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fedsel", default=os.environ.get("CARGO_TARGET_DIR", "target") + "/release/fedsel")
    ap.add_argument("--python", default=sys.executable, help="a Python with torch")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", default=str(HERE.parent.parent / "shared" / "data"))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="training steps and the FedCor round only")
    args = ap.parse_args()
    fmnist = Path(args.data_dir) / "fashion-mnist"
    fmnist = str(fmnist) if (fmnist / "t10k-images-idx3-ubyte.gz").exists() else None

    pairs = []
    for i in range(args.pairs):
        torch_ms = torch_side(args.python, args.threads, fmnist, args.rounds, args.quick)
        fedsel_ms = fedsel_side(args.fedsel, args.threads, args.data_dir, args.rounds, args.quick, fmnist)
        pairs.append((torch_ms, fedsel_ms))
        # The raw times of each pair go to stderr as they come, so a sitting cut short
        # still leaves its finished pairs readable.
        print(f"pair {i + 1}/{args.pairs}: torch {json.dumps(torch_ms)} fedsel {json.dumps(fedsel_ms)}",
              file=sys.stderr, flush=True)

    print(f"| workload ({args.threads} threads, {args.pairs} alternated pairs) "
          "| PyTorch ms | fedsel ms | fedsel speed vs PyTorch | per pair |")
    print("|---|---|---|---|---|")
    for key in pairs[0][0]:
        if not all(key in f for _, f in pairs):
            continue
        ratios = [t[key] / f[key] for t, f in pairs]
        print(f"| {key} | {statistics.median(t[key] for t, _ in pairs):.1f} "
              f"| {statistics.median(f[key] for _, f in pairs):.1f} "
              f"| {statistics.median(ratios):.2f}x "
              f"| {', '.join(f'{r:.2f}' for r in ratios)} |")


if __name__ == "__main__":
    main()
