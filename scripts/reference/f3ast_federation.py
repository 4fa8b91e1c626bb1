"""The F3AST authors' Table 9 federation, written out for fedsel to train on.

`authors_training.py --f3ast` runs the authors' TFF code (github.com/mriberodiaz/f3ast,
commit 27b4e33adffea94a3fe53a5600fe5498f4cd3d5d) on Synthetic(α, α) under SmartPhones
availability. Its data and availability are drawn by their code, fedsel's Table 9 grid draws
its own, and the seed-to-seed spread of the data is far larger than the effect the claim
is about. This script writes, for each seed, exactly what their run trained and tested on,
so that fedsel can be run on the same federation and its F3AST − FedAvg effect read beside
theirs seed by seed:

  - the data: their `generate_synthetic` (`utils/datasets/synthetic_dataset.py`, imported
    over stand-ins for `tensorflow_federated` and `tqdm`, which it never calls), after
    `np.random.seed(seed)` as the child process of `authors_training.py` seeds it, with
    α = β_data = the setting's α, `iid = 0`, 100 users; each user's first ⌊0.9 n⌋ examples
    train and the rest test, as their code splits them. Written as LEAF JSON
    (`train/data.json`, `test/data.json`, users `u000`…`u099` in their order), which
    fedsel's `leaf` loader reads with `holdout = "leaf_test"`: each user trains on its
    train part and the server tests on the test parts pooled, as their `evaluate_fn` does;
  - the availability: their `stateless_binomial(seed=[1, t], probs=q · f_t)` with their
    24-point sinusoid f (`np.sin(np.linspace(0, 2π, 24)) · 0.4 + 0.5`, index t mod 24) and
    the q that `authors_training.py` hands them for the SmartPhones file their repository
    lacks (App. D.4: T_k ~ LogNormal(0, 0.25) from `RandomState(seed)`, q = T / max T), for
    rounds 0..R−1, as a fedsel `trace` CSV (`round,client`).

With `--run FEDSEL` it then trains fedsel on each federation (`fedsel run` of a config it
writes beside the data, `fedsel.toml`: `configs/f3ast/synthetic_base.toml`'s training with
the `leaf` dataset and the `trace` availability), the two arms of the Table 9 grid, `fedavg`
and `f3ast` with the `code` protocol, and prints the final accuracies beside the authors'
rows of `results/authors-code/f3ast-table9-synthetic-authors.csv` and the paired
F3AST − FedAvg differences with their mean and 95 % t-interval. `--coupled-q` draws q as the
driver did before 2026-11-27 (from the data's own stream) and compares with those rows.

Not reproduced on fedsel's side, by design: the model's initial weights (Keras's
Glorot-uniform kernel and zero bias against fedsel's), the local shuffles (their buffer of
418 against a full shuffle), their p_k from the count of batches of 20 rather than of
examples, and their F3AST's padding of a round with fewer than K available clients with
unavailable ones (fedsel trains only available clients).

Usage (the TensorFlow environment of `authors_training.py`'s F3AST runs):
    /work/tff-venv/bin/python scripts/reference/f3ast_federation.py --checkout /tmp/f3ast \\
        --out /tmp/f3ast-fed [--alpha 0] [--seeds 1 2 3 4 5] [--run target/release/fedsel] [--coupled-q]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from authors_training import smartphones_q  # noqa: E402
from stand_ins import import_over  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
AUTHORS_CSV = ROOT / "results/authors-code/f3ast-table9-synthetic-authors.csv"
USERS, ROUNDS, K = 100, 500, 10
SETTING = {0.0: "alpha0", 0.5: "alpha0.5", 1.0: "alpha1"}
# The two arms of configs/f3ast/table9_synthetic.toml the claim compares.
ARMS = {
    "fedavg": ["selection.strategy=\"md\"", "server.aggregation=\"data_size\""],
    "f3ast": ["selection.strategy=\"f3ast\"", "selection.f3ast.protocol=\"code\"",
              "server.aggregation=\"selector\""],
}


def generator(checkout: Path):
    """Their `generate_synthetic`, from their module imported over stand-ins."""
    tff, tqdm = types.ModuleType("tensorflow_federated"), types.ModuleType("tqdm")
    tqdm.trange = range
    module = import_over("f3ast_synthetic_dataset",
                         checkout / "utils/datasets/synthetic_dataset.py",
                         {"tensorflow_federated": tff, "tqdm": tqdm})
    return module.generate_synthetic


def availability(seed: int, rounds: int, coupled: bool) -> list[list[int]]:
    """Each round's available clients, drawn by their call."""
    import tensorflow as tf

    q = smartphones_q(seed, coupled)
    f = np.sin(np.linspace(start=0, stop=2 * np.pi, num=24)) * 0.4 + 0.5
    out = []
    for r in range(rounds):
        a = tf.random.stateless_binomial(shape=(USERS,), seed=[1, r], counts=tf.ones(USERS),
                                         probs=q * f[r % 24], output_dtype=tf.float32).numpy()
        out.append([k for k in range(USERS) if a[k]])
    return out


def export(checkout: Path, out: Path, alpha: float, seed: int, rounds: int, coupled: bool) -> Path:
    d = out / f"{SETTING[alpha]}{'-sizeq' if coupled else ''}-s{seed}"
    np.random.seed(seed)
    x_tr, y_tr, x_te, y_te = generator(checkout)(alpha=alpha, beta=alpha, iid=0, num_users=USERS)
    for part, xs, ys in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        (d / part).mkdir(parents=True, exist_ok=True)
        users = [f"u{k:03d}" for k in range(USERS)]
        doc = {"users": users, "num_samples": [len(y) for y in ys],
               "user_data": {u: {"x": x, "y": [int(v) for v in y]} for u, x, y in zip(users, xs, ys)}}
        (d / part / "data.json").write_text(json.dumps(doc))
    avail = availability(seed, rounds, coupled)
    (d / "fedsel.toml").write_text(BASE.format(k=K, rounds=rounds))
    if not avail[-1]:
        raise SystemExit(f"seed {seed}: no client available in the last round; a trace would cycle early")
    with open(d / "trace.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["round", "client"])
        for r, ks in enumerate(avail):
            w.writerows([r, k] for k in ks)
    n_test = sum(len(y) for y in y_te)
    short = sum(len(ks) < K for ks in avail)
    print(f"{d.name}: {sum(len(y) for y in y_tr)} train / {n_test} test examples, "
          f"{short} of {rounds} rounds with fewer than {K} available", flush=True)
    return d


# configs/f3ast/synthetic_base.toml with the federation read from the export (no α: the data
# are the authors'), the SmartPhones model replaced by their draw, and Table 9's server step.
BASE = """name = "f3ast-table9-authors-federation"
rounds = {rounds}
targets = [0.6]

[dataset]
kind = "leaf"
classes = 10

[partition]
scheme = {{ kind = "natural" }}

[model]
kind = "logreg"

[train]
lr = 0.01
work = {{ epochs = 1 }}
batch_size = 20

[server]
optimizer = "sgd"
lr = 1.0

[selection]
clients_per_round = {k}

[availability]
kind = "trace"
trace = "trace.csv"

[eval]
every = 50
"""


def fedsel_final(fedsel: Path, fed: Path, arm: str, seed: int, runs: Path) -> float:
    out = runs / f"{fed.name}-{arm}"
    cmd = [str(fedsel), "run", str(fed / "fedsel.toml"), "--out", str(out), "--overwrite", "--seed", str(seed),
           "--set", f"dataset.path=\"{fed}\""]
    for s in ARMS[arm]:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return float(json.loads((out / "summary.json").read_text())["final_acc"])


def authors_rows(setting: str, suffix: str) -> dict:
    """The authors' final accuracies by (arm, seed), from their runs on the same q recipe."""
    rows = {}
    if AUTHORS_CSV.exists():
        for r in csv.DictReader(open(AUTHORS_CSV)):
            if r["setting"] == setting and r["method"] in (a + suffix for a in ARMS):
                rows[(r["method"][:len(r["method"]) - len(suffix)], int(r["seed"]))] = float(r["value"])
    return rows


def interval(xs: list[float]) -> str:
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return f"{m:+.4f}"
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}.get(n, 2.0)
    h = t * sd / math.sqrt(n)
    return f"{m:+.4f} [{m - h:+.4f}, {m + h:+.4f}] (n = {n})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", type=Path, required=True, help="mriberodiaz/f3ast at 27b4e33")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--alpha", type=float, default=0.0, choices=sorted(SETTING))
    ap.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--run", type=Path, help="a fedsel binary: train both arms on each federation")
    ap.add_argument("--coupled-q", action="store_true",
                    help="q from the data's own stream, as authors_training.py drew it before 2026-11-27 "
                         "(the rows of methods fedavg-sizeq, f3ast-sizeq)")
    a = ap.parse_args()
    feds = [export(a.checkout, a.out, a.alpha, s, a.rounds, a.coupled_q) for s in a.seeds]
    if a.run is None:
        return
    theirs = authors_rows(SETTING[a.alpha], "-sizeq" if a.coupled_q else "")
    ours_d, theirs_d = [], []
    print("seed | fedsel FedAvg | fedsel F3AST | diff | authors FedAvg | authors F3AST | diff")
    for s, fed in zip(a.seeds, feds):
        fa, f3 = (fedsel_final(a.run, fed, arm, s, a.out / "runs") for arm in ("fedavg", "f3ast"))
        ours_d.append(f3 - fa)
        ta, t3 = theirs.get(("fedavg", s)), theirs.get(("f3ast", s))
        line = f"{s} | {fa:.4f} | {f3:.4f} | {f3 - fa:+.4f}"
        if ta is not None and t3 is not None:
            theirs_d.append(t3 - ta)
            line += f" | {ta:.4f} | {t3:.4f} | {t3 - ta:+.4f}"
        print(line, flush=True)
    print(f"fedsel F3AST − FedAvg on their federations: {interval(ours_d)}")
    if theirs_d:
        print(f"authors' F3AST − FedAvg:                      {interval(theirs_d)}")


if __name__ == "__main__":
    main()
