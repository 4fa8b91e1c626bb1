"""DivFL's greedy facility location beside the DivFL baseline of the HiCS-FL authors'
repository (github.com/CityChan/HiCS-FL, `server/server_divfl.py`, commit
25f309d118d72c8ca176b6551704f648b304e100), on the same client gradients.

The authors' `Server_DivFL` runs unchanged on the gradients as their `get_gradients` lays
them out (one array per parameter tensor, local − global): `submod_sampling` forms the
Euclidean distance matrix (`compute_diff`, a Python loop over pairs summing
Σ_tensors Σ (g_i − g_j)², then √), zeroes its diagonal and calls `select_cl_submod`, which
runs `lazy_greedy` (deterministic) or, as their `train` does, `stochastic_greedy` (m =
max(K, ⌊0.1 N⌋) candidates a step, drawn by `np.random.choice` without replacement from the
clients not yet chosen). Their `train` trains every client every round and refreshes every
gradient: fedsel's `refresh = "ideal"`. The object is made without `__init__` (which loads
data sets and builds models) and given `args = {"n_clients": N}`, all these methods read.
Imports the compared methods never use (their client, model and data modules, torchvision,
progress, tqdm) are empty stand-ins.

fedsel's side is `fedsel.Selector("divfl", refresh="ideal", stochastic=..., fraction=0.1)`,
whose query object answers `gradients(clients, scope)` with the same gradients, flattened
in the authors' tensor order, as f32.

Compared:
  - deterministic: the authors' lazy greedy set against fedsel's greedy set (stochastic =
    false), exactly, on R gradient sets. By default the authors are given the f32 values
    widened to float64 (`--authors-dtype float64`), so that the comparison is of the
    algorithm; `--authors-dtype float32` hands them the f32 arrays, as their code holds
    them (their distances are then computed in float32). A differing set is classified by
    a plain greedy on the authors' matrix: `near-tie` if, at the first step where the two
    sets part, the best two costs are within 1e-9 relative, else `other`;
  - stochastic: per-client selection frequencies over S seeds × R rounds (the same
    gradient sets on every seed), as the total-variation distance to the authors' against
    the authors' own seed-to-seed distance (seeds 1..S against S+1..2S). The authors'
    draws use NumPy's global generator (`np.random.seed(seed)` before each run, as their
    `train` seeds each round); fedsel's its own seed.

Usage:
    git clone https://github.com/CityChan/HiCS-FL /tmp/HiCS-FL && git -C /tmp/HiCS-FL checkout 25f309d118d72c8ca176b6551704f648b304e100
    python scripts/reference/divfl_hics_repo.py --checkout /tmp/HiCS-FL [--clients 100] [--per-round 10] [--rounds 20] [--seeds 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np

from frequency import tv


def stub_imports():
    """Empty stand-ins for the modules `server_divfl.py` imports for training and data only."""
    names = {
        "client": {}, "client.client_base": {"Client_base": None},
        "cnn": {"FMNIST_CNN": None, "CIFAR10_CNN": None},
        "progress": {}, "progress.bar": {"Bar": None},
        "tqdm": {"tqdm": None},
        "torchvision": {}, "torchvision.models": {"resnet18": None},
        "sampling": {"partition_data_various_alpha": None,
                     "partition_data_various_alpha_imagenet": None,
                     "LocalDataloaders": None},
    }
    for name, attrs in names.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


SHAPES = [(16, 1, 3, 3), (16,), (10, 64), (10,)]  # a small CNN's tensors, in parameter order


def gradient_sets(seed: int, n: int, rounds: int):
    """R rounds of per-client gradients (f32): five groups of clients, each round a fresh
    group direction per group plus client noise and a client scale."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 5, size=n)
    scale = rng.lognormal(0.0, 0.3, size=n)
    sets = []
    for _ in range(rounds):
        centres = [[rng.standard_normal(s) for s in SHAPES] for _ in range(5)]
        g = []
        for i in range(n):
            g.append([(scale[i] * (c + 0.6 * rng.standard_normal(c.shape))).astype(np.float32)
                      for c in centres[group[i]]])
        sets.append(g)
    return sets


class Gradients:
    """fedsel's query: the round's gradients, flattened in the authors' tensor order."""

    def __init__(self):
        self.g = None

    def gradients(self, clients, scope):
        return [np.concatenate([t.ravel() for t in self.g[c]]).tolist() for c in clients]


def authors_server(server_divfl, n):
    s = object.__new__(server_divfl.Server_DivFL)
    s.args = {"n_clients": n}
    return s


def plain_greedy(d: np.ndarray, k: int):
    """Greedy facility location on d: picks, and each step's best and second-best cost."""
    n = len(d)
    nearest = np.full(n, np.inf)
    picks, steps = [], []
    for _ in range(k):
        cost = np.array([np.minimum(nearest, d[:, j]).sum() if j not in picks else np.inf
                         for j in range(n)])
        order = np.argsort(cost, kind="stable")
        picks.append(int(order[0]))
        steps.append((cost[order[0]], cost[order[1]]))
        nearest = np.minimum(nearest, d[:, order[0]])
    return picks, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", required=True, help="a checkout of CityChan/HiCS-FL")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--data-seed", type=int, default=1)
    ap.add_argument("--authors-dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    stub_imports()
    sys.path[:0] = [args.checkout, f"{args.checkout}/server"]
    import server_divfl  # the authors' module, unchanged
    import fedsel

    n, k, R, S = args.clients, args.per_round, args.rounds, args.seeds
    sets = gradient_sets(args.data_seed, n, R)
    dt = np.float64 if args.authors_dtype == "float64" else np.float32
    theirs_g = [[[t.astype(dt) for t in g] for g in gs] for gs in sets]
    server = authors_server(server_divfl, n)
    query = Gradients()
    sizes = [100] * n

    # deterministic: lazy greedy against fedsel's greedy
    figures = {"clients": n, "per_round": k, "rounds": R, "seeds": S,
               "authors_dtype": args.authors_dtype}
    same, near, other, other_rounds = 0, 0, 0, []
    matrices = []
    sel = fedsel.Selector("divfl", sizes=sizes, per_round=k, rounds=R, seed=1,
                          refresh="ideal", stochastic=False)
    for t in range(R):
        theirs = sorted(int(i) for i in server.submod_sampling(t, theirs_g[t], k, stochastic=False))
        d = server.compute_diff(theirs_g[t], "euclidean")
        np.fill_diagonal(d, 0)
        matrices.append(d)
        query.g = sets[t]
        ours = sel.select(t, list(range(n)), k, query)
        sel.observe(ours)
        if sorted(ours) == theirs:
            same += 1
            continue
        picks, steps = plain_greedy(d, k)
        step = next((j for j, p in enumerate(picks) if p not in ours or p not in theirs), None)
        if step is not None and abs(steps[step][1] - steps[step][0]) <= 1e-9 * steps[step][0]:
            near += 1
        else:
            other += 1
            other_rounds.append({"round": t, "authors": theirs, "fedsel": sorted(ours),
                                 "plain_greedy_on_authors_matrix": sorted(picks)})
    figures["deterministic"] = {"same": same, "near_tie": near, "other": other,
                                "other_rounds": other_rounds}
    print(f"deterministic greedy ({R} gradient sets, N = {n}, K = {k}, authors given "
          f"{args.authors_dtype}): same set {same}/{R}, near-tie {near}, other {other}")
    for o in other_rounds:
        print("  differs:", o)

    # stochastic: frequencies over the seeds
    def authors_run(seed):
        np.random.seed(seed)
        c = np.zeros(n)
        for t in range(R):
            c[server.select_cl_submod(t, k, matrices[t], stochastic=True)] += 1
        return c

    ref, floor, ours_c = np.zeros(n), np.zeros(n), np.zeros(n)
    for s in range(1, S + 1):
        ref += authors_run(s)
        floor += authors_run(S + s)
        sel = fedsel.Selector("divfl", sizes=sizes, per_round=k, rounds=R, seed=s,
                              refresh="ideal", stochastic=True, fraction=0.1)
        for t in range(R):
            query.g = sets[t]
            picked = sel.select(t, list(range(n)), k, query)
            sel.observe(picked)
            ours_c[picked] += 1
    figures["stochastic"] = {"tv_fedsel": tv(ours_c, ref), "tv_floor": tv(floor, ref)}
    st = figures["stochastic"]
    print(f"stochastic greedy (m = max(K, 0.1 N) = {max(k, int(0.1 * n))}), {S} seeds × {R} rounds: "
          f"selection-frequency TV fedsel–authors {st['tv_fedsel']:.4f}, authors' seed-to-seed "
          f"{st['tv_floor']:.4f} (ratio {st['tv_fedsel'] / st['tv_floor']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
