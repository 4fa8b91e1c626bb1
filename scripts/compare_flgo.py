"""FedAvg on one FLGo task, in FLGo and in fedsel; called by scripts/compare-flgo.sh.

FLGo's options mirror the fedsel config given with --config (uniform sampling of 20 %, the
plain mean of the returned models, 1 epoch of batch 64 at lr 0.1 without decay or local
validation), so the two differ only in their random streams: FLGo seeds 0-2, fedsel 1-3.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import flgo  # noqa: E402
import flgo.algorithm.fedavg as fedavg  # noqa: E402

FLGO_OPTION = {
    "learning_rate": 0.1,
    "learning_rate_decay": 1.0,
    "batch_size": 64,
    "num_epochs": 1,
    "proportion": 0.2,
    "sample": "uniform",
    "aggregate": "uniform",
    "train_holdout": 0.0,
    "gpu": [],
    "no_log_console": True,
    "log_level": "WARNING",
}


def flgo_run(task: str, rounds: int, seed: int) -> dict:
    runner = flgo.init(task, fedavg, option={**FLGO_OPTION, "num_rounds": rounds, "seed": seed})
    runner.run()
    out = runner.gv.logger.output
    acc, loss = out["test_accuracy"], out["test_loss"]
    return {"best_acc": max(acc), "final_acc": acc[-1], "best_loss": min(loss), "final_loss": loss[-1]}


def fedsel_run(binary: str, config: str, task: str, rounds: int, seed: int, out: Path) -> dict:
    run_dir = out / f"fedsel-s{seed}"
    subprocess.run(
        [binary, "run", config, "--seed", str(seed), "--out", str(run_dir), "--overwrite",
         "--set", f'dataset.path="{task}"', "--set", f"rounds={rounds}"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    s = json.loads((run_dir / "summary.json").read_text())
    return {k: s[k] for k in ("best_acc", "final_acc", "best_loss", "final_loss")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fedsel", required=True, help="the fedsel binary")
    ap.add_argument("--config", required=True)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    task = str((args.out / "task").resolve())
    if not Path(task, "data.json").exists():
        flgo.gen_task({"benchmark": {"name": "flgo.benchmark.synthetic_regression",
                                     "para": {"alpha": 0.5, "beta": 0.5, "num_clients": 30}}},
                      task_path=task)
    rows = [("FLGo 0.4.4", s, flgo_run(task, args.rounds, s)) for s in (0, 1, 2)]
    rows += [("fedsel", s, fedsel_run(args.fedsel, args.config, task, args.rounds, s, args.out))
             for s in (1, 2, 3)]
    keys = ("best_acc", "final_acc", "best_loss", "final_loss")
    print(f"FedAvg on {task}, {args.rounds} rounds\n")
    print("| framework | seed | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for name, seed, r in rows:
        print(f"| {name} | {seed} | " + " | ".join(f"{r[k]:.4f}" for k in keys) + " |")
    for name in ("FLGo 0.4.4", "fedsel"):
        mine = [r for n, _, r in rows if n == name]
        print(f"| {name} | mean | " + " | ".join(
            f"{statistics.mean(r[k] for r in mine):.4f}" for k in keys) + " |")
    (args.out / "compare.json").write_text(json.dumps(
        [{"framework": n, "seed": s, **r} for n, s, r in rows], indent=1))


if __name__ == "__main__":
    sys.exit(main())
