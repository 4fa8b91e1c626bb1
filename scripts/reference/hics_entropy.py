"""HiCS-FL's entropy estimates and clusters beside the authors' `server/server_hics.py`
(github.com/CityChan/HiCS-FL), on the same output-layer updates.

The authors' `Server_HiCS` methods run unchanged on the updates ([ΔW (C × h), Δb (C)] per
client, the layout of their `get_gradients_fc`): `magnitude_gradient` and
`estimated_entropy_from_grad` give Ĥ (softmax of ΔW's row means at T = 0.001), and
`cluster_sampling` gives the Ward clusters, read where it hands them to
`sample_clients_entropy`. Their module imports training and data code the compared methods
never call (torchvision, progress, tqdm and their own model, data and client modules); those
imports are satisfied with empty stand-ins.

fedsel's side is the public `fedsel.Selector("hics", ...)` fed the same updates through
`observe` (Δb then the weight as [h, C] row-major, stored as f32; the inputs are f32 values,
given to the authors as float64 so that the comparison is of the algorithm). The selector
exposes no estimate, so the driver reads them through its exact decisions:
  - Var(Ĥ), the statistic of the code's switch to Clustered Sampling, is the largest
    `cs_switch` at which the selector still switches (bisected over the f64 values, so it is
    read exactly);
  - each client's Ĥ_k is read the same way from a two-client selector holding only that
    client's update (the other's Ĥ is ln C): Var = ((ln C − Ĥ_k)/2)²;
  - the clusters: with γ⁰ so large that Eq. 10 draws the clusters in the order of their mean
    Ĥ with certainty (every other probability below e^-40), a budget equal to the size of
    the top j of the authors' clusters must select exactly their union, for every j.
The Python Selector refuses protocol "code" (it has no training regime to check), so the
clusters are compared under protocol "paper" on updates where the two protocols' distances
are proportional: ΔW = 2^e ⊗ Δb (exact in f32) makes cos([ΔW, Δb]) = cos(Δb), and λ = 1/11
makes λ·arccos + (1 − λ)|ΔĤ| = (arccos + 10|ΔĤ|)/11, the code's distance over 11; Ward's
merges do not change under a common scale.

Usage: python scripts/reference/hics_entropy.py --checkout /path/to/HiCS-FL
"""

import argparse
import contextlib
import io
import math
import struct
import sys
import types

import numpy as np


def stub_imports():
    """Empty stand-ins for the modules `server_hics.py` imports for training and data only."""
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


class NoQuery:
    """HiCS-FL asks the clients nothing during selection."""


def f64_bits(x):
    return struct.unpack("<q", struct.pack("<d", x))[0]


def bits_f64(i):
    return struct.unpack("<d", struct.pack("<q", i))[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", required=True, help="a checkout of CityChan/HiCS-FL")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--per-round", type=int, default=4)
    ap.add_argument("--clusters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=4)
    args = ap.parse_args()

    stub_imports()
    sys.path[:0] = [args.checkout, f"{args.checkout}/server"]
    import server_hics  # the authors' module, unchanged
    import fedsel

    n, c, h, k, big_m = args.clients, args.classes, args.hidden, args.per_round, args.clusters
    temp, lam, rounds = 0.001, 10.0, 1_000_000
    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(200, 600, size=n)

    # Updates shaped as Eq. 5 says: Δb ∝ (label share − mean prediction), four groups of
    # clients with different label skew; ΔW's rows are Δb times powers of two.
    alphas = np.array([0.2, 1.0, 5.0, 100.0])[rng.integers(0, 4, size=n)]
    shares = np.array([rng.dirichlet([a] * c) for a in alphas])
    db = (0.004 * (shares - 1.0 / c) + 2e-4 * rng.standard_normal((n, c))).astype(np.float32)
    scale = (2.0 ** rng.integers(-1, 2, size=h)).astype(np.float32)
    dw = db[:, :, None] * scale[None, None, :]  # (n, C, h), exact in f32
    grads = [[dw[i].astype(np.float64), db[i].astype(np.float64)] for i in range(n)]
    grads32 = [[dw[i], db[i]] for i in range(n)]
    updates = [np.concatenate([db[i], dw[i].T.reshape(-1)]).tolist() for i in range(n)]

    # The authors' side.
    srv = server_hics.Server_HiCS.__new__(server_hics.Server_HiCS)
    srv.args = {"temp": temp, "lambda": lam, "n_clients": n, "M": big_m, "frac": k / n,
                "epochs": rounds, "gamma": 4}
    srv.n_samples, srv.weights = sizes, sizes / sizes.sum()
    h_ref = np.array(srv.estimated_entropy_from_grad(srv.magnitude_gradient(grads)))
    h_ref32 = np.array(srv.estimated_entropy_from_grad(srv.magnitude_gradient(grads32)))
    var_ref = float(h_ref.var())
    seen = {}

    def spy(entropy, clusters, n_samples, epoch):
        """Keeps what `cluster_sampling` hands over; the draw itself is random, not compared
        (and its `int(choice(...))` fails under NumPy 2.4)."""
        seen["means"], seen["clusters"] = np.array(entropy), [list(map(int, g)) for g in clusters]
        return []

    srv.sample_clients_entropy = spy
    np.random.seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        srv.cluster_sampling(grads, None, "cosine", 0)
    if "clusters" not in seen:
        sys.exit(f"Var(Ĥ) = {var_ref:.3f} ≥ 0.1: the authors' code took its Clustered Sampling "
                 "branch; choose another --seed")

    # fedsel's side: the warm-up through the public API stores the updates.
    opts = dict(protocol="paper", statistic="weight_rows", estimator="softmax",
                temperature=temp, clusters=big_m, **{"lambda": 1.0 / 11.0})

    def selector(sizes_, cs_switch=0.0, gamma0=4.0):
        return fedsel.Selector("hics", sizes=list(map(int, sizes_)), per_round=1,
                               rounds=rounds, seed=args.seed, classes=c,
                               cs_switch=cs_switch, gamma0=gamma0, **opts)

    full = selector(sizes)
    t = 0
    while True:
        chosen = full.select(t, available=list(range(n)), budget=k, query=NoQuery())
        full.observe(chosen, updates=[updates[i] for i in chosen])
        t += 1
        if not full.state()["selector"]["unseen"]:
            break
    state = full.state()
    stored = np.array(state["selector"]["latest"], dtype=np.float64)
    assert np.array_equal(stored, np.array(updates, dtype=np.float32).astype(np.float64))

    def switched(state_, sizes_, threshold, rnd):
        sel = selector(sizes_, cs_switch=threshold)
        sel.load_state(state_)
        return sel.select(rnd, available=list(range(len(sizes_))), budget=1 if len(sizes_) == 2 else k,
                          query=NoQuery())

    def read_variance(state_, sizes_):
        """The largest cs_switch at which the selector switches: Var(Ĥ), exactly."""
        tiny = 1e-300
        for rnd in range(t, t + 200):
            on, off = switched(state_, sizes_, tiny, rnd), switched(state_, sizes_, 0.0, rnd)
            if on != off:
                break
        else:
            raise RuntimeError("no round tells the two branches apart")
        lo, hi = f64_bits(tiny), f64_bits(100.0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if switched(state_, sizes_, bits_f64(mid), rnd) == on:
                lo = mid
            else:
                hi = mid
        return bits_f64(lo)

    var_fedsel = read_variance(state, sizes)
    pair = dict(state)
    h_fedsel = []
    for i in range(n):
        pair["clients"] = 2
        pair["selector"] = {"latest": [updates[i], []], "unseen": []}
        v = read_variance(pair, [1, 1])
        h_fedsel.append(math.log(c) - 2.0 * math.sqrt(v))
    h_fedsel = np.array(h_fedsel)

    # Clusters: the authors' in order of mean Ĥ, as unions.
    order = np.argsort(-seen["means"], kind="stable")
    means = seen["means"][order]
    gaps = -np.diff(means)
    gamma0 = 700.0 / (means[0] - means[-1])
    decisive = gamma0 * gaps.min() >= 40.0
    union, agree = [], []
    for j in order[:-1]:
        union += seen["clusters"][j]
        sel = selector(sizes, gamma0=gamma0)
        sel.load_state(state)
        got = sel.select(t, available=list(range(n)), budget=len(union), query=NoQuery())
        agree.append(sorted(got) == sorted(union))

    relh = np.abs(h_fedsel - h_ref) / np.abs(h_ref)
    print(f"HiCS-FL, {n} clients, C = {c}, h = {h}, T = {temp}, M = {big_m}, seed {args.seed}")
    print("compared:")
    print(f"  estimated entropies Ĥ (max |Δ|/|Ĥ|)      {relh.max():.3e}  (Ĥ from {h_ref.min():.3f} to {h_ref.max():.3f})")
    print(f"  Var(Ĥ), the switch statistic (rel.)      {abs(var_fedsel - var_ref) / var_ref:.3e}  (Var = {var_ref:.4f})")
    print(f"  clusters, unions in mean-Ĥ order equal   {sum(agree)}/{len(agree)}"
          f"  (sizes {[len(seen['clusters'][j]) for j in order]}; "
          f"{'decisive' if decisive else 'NOT decisive: cluster means too close, choose another --seed'})")
    print("measured effect of the authors' float32:")
    print(f"  Ĥ from float32 updates vs float64        {(np.abs(h_ref32 - h_ref) / h_ref).max():.3e}")


if __name__ == "__main__":
    main()
