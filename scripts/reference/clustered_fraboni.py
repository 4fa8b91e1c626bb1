#!/usr/bin/env python3
"""fedsel's Clustered Sampling (Alg. 1 and 2) beside Fraboni et al.'s own code.

The reference is `py_func/clustering.py` on the `clustered_sampling` branch of
github.com/Accenture/Labs-Federated-Learning (commit below), from a checkout the user
fetched (`--checkout`): its code is never part of this repository. It needs NumPy and
SciPy (`fcluster`, and `linkage` as `FedProx_clustered_sampling` in `py_func/FedProx.py`
calls it). One adaptation: their `get_clusters_with_alg2` takes `int()` of a one-element
array, and `sample_clients` of `choice(n, 1, p)`, which NumPy 2.4 refuses; the module's
`np.array` and `choice` are given arrays on which that int() works as under NumPy 1.x
(`_NumPy1`; `choice` is NumPy's global one, the same draws), nothing else changes.

Both sides see the same clients (sizes 50..400, p_i ∝ n_i), all available, and m = K draws
a round. Alg. 2 learns from updates: each client's update is a fixed function of the
client and the round (a cluster centre of its group plus noise, the same vector on both
sides whenever that client trains in that round), and every client starts at the zero
update, as the authors' loop starts with `get_gradients(model, [model] * K)`. The
authors' round is their loop's: `get_matrix_similarity_from_grads(gradients, "cosine")`
(arccos of the cosine, 0 where an update is zero), `linkage(., "ward")`,
`get_clusters_with_alg2`, `sample_clients`, then the sampled clients' latest updates
replace their history (a client drawn twice keeps one).

Compared, as the selection is random:
- Alg. 1's buckets are deterministic on both sides but fedsel's are not exposed, so the
  bucket structure is compared through what it decides: the per-client selection
  frequencies and the co-selection frequencies of client pairs (which clients share a
  round), over the seeds;
- Alg. 2 the same, on the update stream above.
Each as the total-variation distance to the authors' frequencies, against the authors'
own seed-to-seed distance (seeds 1..S against S+1..2S). The authors' draws use NumPy's
global generator (`np.random.seed(seed)` before each run); fedsel's its own seed.

    git clone https://github.com/Accenture/Labs-Federated-Learning /tmp/LFL && git -C /tmp/LFL checkout 6707484c4a4e6369be71b7b3a7eb559d39364ef1
    python scripts/reference/clustered_fraboni.py --checkout /tmp/LFL [--seeds 30] [--rounds 40]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

from frequency import tv

COMMIT = "6707484c4a4e6369be71b7b3a7eb559d39364ef1"


class Unavailable(RuntimeError):
    """The reference checkout (or SciPy) could not be had."""


def load_authors(checkout: Path):
    src = checkout / "py_func" / "clustering.py"
    if not src.is_file():
        raise Unavailable(
            f"{src} is missing: pass --checkout, a clone of Accenture/Labs-Federated-Learning at {COMMIT}"
        )
    try:
        import scipy.cluster.hierarchy  # noqa: F401
    except ImportError as e:
        raise Unavailable(f"SciPy is needed by the authors' clustering: {e}") from e
    spec = importlib.util.spec_from_file_location("fraboni_clustering", src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.np = _NumPy1()
    module.choice = lambda *a, **k: np.random.choice(*a, **k).view(_OneElement)
    return module


class _OneElement(np.ndarray):
    """An array whose int() works when it holds one element, as under NumPy 1.x."""

    def __int__(self):
        return int(self.reshape(-1)[0]) if self.size == 1 else super().__int__()


class _NumPy1:
    """NumPy for the authors' module, but `np.array` gives arrays whose one-element int()
    works: their `get_clusters_with_alg2` calls `int(new_weight * epsilon)` on a
    one-element array, which NumPy 2.4 refuses (a TypeError) and NumPy 1.x allowed."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def array(*args, **kwargs):
        return np.array(*args, **kwargs).view(_OneElement)


def federation(seed: int, n: int, dim: int = 12, groups: int = 4) -> dict:
    rng = np.random.default_rng(30_000 + seed)
    return {
        "sizes": [int(s) for s in rng.integers(50, 401, n)],
        "group": rng.integers(groups, size=n),
        "centres": rng.normal(size=(groups, dim)),
        "seed": seed,
    }


def update(fed: dict, k: int, r: int) -> np.ndarray:
    """Client k's update when it trains in round r (float32, as fedsel receives updates)."""
    rng = np.random.default_rng([fed["seed"], k, r])
    u = fed["centres"][fed["group"][k]] + 0.3 * rng.normal(size=fed["centres"].shape[1])
    return u.astype(np.float32)


def run_authors(cs, fed: dict, alg: int, m: int, rounds: int, seed: int) -> list[list[int]]:
    from scipy.cluster.hierarchy import linkage

    np.random.seed(seed)
    n = len(fed["sizes"])
    weights = np.array(fed["sizes"]) / np.sum(fed["sizes"])
    dim = fed["centres"].shape[1]
    gradients = [[np.zeros(dim, dtype=np.float32)] for _ in range(n)]
    if alg == 1:
        distri = cs.get_clusters_with_alg1(m, weights)
    picks = []
    for r in range(rounds):
        if alg == 2:
            sim = cs.get_matrix_similarity_from_grads(gradients, distance_type="cosine")
            distri = cs.get_clusters_with_alg2(linkage(sim, "ward"), m, weights)
        sampled = [int(k) for k in cs.sample_clients(distri)]
        picks.append(sampled)
        if alg == 2:
            for k in sampled:
                gradients[k] = [update(fed, k, r)]
    return picks


def run_fedsel(fed: dict, alg: int, m: int, rounds: int, seed: int) -> list[list[int]]:
    import fedsel

    n = len(fed["sizes"])
    sel = fedsel.Selector(f"cs{alg}", sizes=fed["sizes"], per_round=m, rounds=rounds, seed=seed)
    picks = []
    for r in range(rounds):
        sampled = [int(k) for k in sel.select(r, available=list(range(n)), budget=m, query=None)]
        picks.append(sampled)
        sel.observe(sampled, **({"updates": [update(fed, k, r).tolist() for k in sampled]} if alg == 2 else {}))
    return picks


def frequencies(picks: list[list[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    single, pairs = np.zeros(n), np.zeros((n, n))
    for s in picks:
        for k in s:
            single[k] += 1
        u = sorted(set(s))
        for x, i in enumerate(u):
            for j in u[x + 1 :]:
                pairs[i, j] += 1
    return single, pairs[np.triu_indices(n, 1)]


def compare(cs, alg: int, n: int, m: int, seeds: int, rounds: int, fed_seed: int = 1) -> dict:
    fed = federation(fed_seed, n)
    acc = {side: [np.zeros(n), np.zeros(n * (n - 1) // 2)] for side in ("ref", "other", "ours")}
    for s in range(1, seeds + 1):
        for side, picks in (
            ("ref", run_authors(cs, fed, alg, m, rounds, s)),
            ("other", run_authors(cs, fed, alg, m, rounds, seeds + s)),
            ("ours", run_fedsel(fed, alg, m, rounds, s)),
        ):
            f, p = frequencies(picks, n)
            acc[side][0] += f
            acc[side][1] += p
    ref, other, ours = acc["ref"], acc["other"], acc["ours"]
    return {
        "alg": alg, "n": n, "m": m, "seeds": seeds, "rounds": rounds,
        "tv_fedsel": tv(ours[0], ref[0]), "tv_reference": tv(other[0], ref[0]),
        "tv_pairs_fedsel": tv(ours[1], ref[1]), "tv_pairs_reference": tv(other[1], ref[1]),
    }


def report(r: dict) -> str:
    return (
        f"Alg. {r['alg']}: N = {r['n']}, m = {r['m']}, {r['rounds']} rounds, {r['seeds']} seeds: "
        f"clients TV(fedsel, authors) {r['tv_fedsel']:.4f}, authors seed to seed {r['tv_reference']:.4f}; "
        f"pairs {r['tv_pairs_fedsel']:.4f}, authors {r['tv_pairs_reference']:.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--clients", type=int, default=30)
    p.add_argument("--per-round", type=int, default=5)
    p.add_argument("--algs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ratio", type=float, default=1.5)
    a = p.parse_args(argv)
    try:
        cs = load_authors(a.checkout)
    except Unavailable as e:
        print(f"skipped: {e}")
        return 0
    ok = True
    for alg in a.algs:
        r = compare(cs, alg, a.clients, a.per_round, a.seeds, a.rounds)
        print(report(r))
        ok &= r["tv_fedsel"] <= a.ratio * r["tv_reference"]
        ok &= r["tv_pairs_fedsel"] <= a.ratio * r["tv_pairs_reference"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
