"""F3AST's rate vector and selections beside the authors' `utils/training_utils.py`
(github.com/mriberodiaz/f3ast, commit 27b4e33adffea94a3fe53a5600fe5498f4cd3d5d).

The authors' selector is the `client_datasets(round_num, r_vector)` closure that their
`build_availability_client_datasets_fn` returns: it draws the round's availability
(`tf.random.stateless_binomial`, Bernoulli(q_k · f_t), q_k ∝ 1/p_k normalised to max 1, f_t
the 24-round sinusoid 0.4 sin θ + 0.5), then `update_vectors` takes the top K of
∂(−Σ p²/r)/∂r · a (a `tf.GradientTape` through `negative_variance_fn`), sets
r ← (1 − β) r + β 1_S (`tensor_scatter_nd_add`), and returns the weights p_k / r_k of the
updated r (`divide_no_nan`). The training loop (`utils/training_loop_importance.py`) feeds
r back each round; the aggregation (`ImportanceSamplingFactory`,
`optimization/shared/importance_aggregation_factory.py`) divides Σ w_k Δ_k by K.

TensorFlow Federated cannot be installed here, and the selector is written in TensorFlow ops,
so the authors' module is imported unchanged (`import training_utils` from their `utils/`)
over stand-ins:
  - `tensorflow`: a NumPy stand-in for the ops the selector calls (`Variable`/`assign`,
    `constant`, `ones`, `ones_like`, `reshape`, `gather`, `multiply`, `math.divide_no_nan`,
    `reduce_sum`, `math.top_k` (descending, equal values lowest index first, as TF documents),
    `tensor_scatter_nd_add`, `function` (identity), and `GradientTape`, a reverse-mode tape
    over Mul, DivNoNan, Sum and Neg with TF's registered gradients: for DivNoNan(x, y),
    ∂/∂y = grad · div_no_nan(div_no_nan(−x, y), y)). `random.stateless_binomial` draws
    Bernoulli(probs) from NumPy's generator seeded (driver seed, round) — TF's Philox
    stream is not reproduced; the same availability is handed to fedsel. Anything else the
    module touches at import (type annotations such as `tf.data.Dataset`) is an inert
    placeholder.
  - `tensorflow_federated`, `absl.logging`: inert placeholders (annotations, log calls).
  - the client data: an object whose `client_ids` are 0..N−1 and whose per-client
    "dataset" is a list of n_k elements, so their `len(list(dataset))` gives p_k ∝ n_k.
With `--dtype float64` (the default) the stand-in computes in float64 where the authors
ask for `tf.float32`, so that the comparison is of the algorithm; `--dtype float32` runs
their dtype and measures what the precision alone changes.

fedsel's side is `fedsel.Selector("f3ast", protocol="code", beta=β)` given the same sizes,
budget K and, each round, the clients the authors' draw made available.

Compared:
  - lockstep: before every round fedsel's r is set to the authors' r (`load_state`); the
    chosen set, the updated r (max |Δ| / max |r_authors|) and the weights (fedsel's × K
    against the authors' p/r) are compared, and each round whose set differs is
    classified: `padding` (fewer than K available: the authors' top_k fills the set with
    unavailable clients of score 0, lowest ids first, and raises their r; fedsel takes the
    available ones only) or `near-tie` (every client in the symmetric difference has a
    score within 1000 ε (the dtype's; 2.2e-13 in float64) relative of the authors' K-th score: the order among equal
    scores is decided by rounding, (p²/r)/r in TF's gradient against p²/(r·r) in fedsel)
    or `other` (none expected);
  - free running over ≥ 30 seeds: the per-client selection frequencies, as the
    total-variation distance to the authors' against the authors' own seed-to-seed
    distance (seeds 1..S against S+1..2S), and the max relative difference of the final r;
    then, to measure the padding alone, the same TV with fedsel told, in the rounds with
    fewer than K available, that the authors' padding clients are available too (so that
    it takes the authors' set), and the TV against the authors' picks of available
    clients only.
Both availability models are run: the authors' sinusoid (`sine_wave=True`, their default;
some rounds have fewer than K available) and every client available (`sine_wave=False`).

Usage:
    git clone https://github.com/mriberodiaz/f3ast /tmp/f3ast && git -C /tmp/f3ast checkout 27b4e33adffea94a3fe53a5600fe5498f4cd3d5d
    python scripts/reference/f3ast_core.py --checkout /tmp/f3ast [--seeds 30] [--rounds 200] [--dtype float64]
"""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np

from frequency import tv


# --------------------------------------------------------------------------- stand-ins


class Inert:
    """Placeholder for anything the module touches only at import (annotations)."""

    def __getattr__(self, name):
        return Inert()

    def __call__(self, *a, **k):
        return Inert()

    def __getitem__(self, k):
        return Inert()


class Node:
    """A traced value: the output of a stand-in op with its inputs' gradient functions."""

    def __init__(self, value, parents=()):
        self.value = value
        self.parents = parents  # (input, grad -> input's grad)

    def __neg__(self):  # TF's Neg: ∂ = −grad
        return Node(-self.value, ((self, lambda g: -g),))

    def numpy(self):
        return self.value


class Variable:
    def __init__(self, value, dtype=None):
        self.value = np.array(_val(value), dtype=TF.dtype)

    def assign(self, value):
        self.value = np.array(_val(value), dtype=TF.dtype)
        return self

    def numpy(self):
        return self.value.copy()

    # `(1 - beta) * r_vector`: a Python float converted to the tensor's dtype.
    def __rmul__(self, other):
        return TF.dtype(other) * self.value

    __mul__ = __rmul__

    def __len__(self):
        return len(self.value)


def _val(x):
    if isinstance(x, (Node, Variable)):
        return x.value
    return np.asarray(x, dtype=TF.dtype) if not isinstance(x, np.ndarray) else x


def _traced(x):
    return isinstance(x, (Node, Variable))


def _div_no_nan(x, y):
    x, y = np.asarray(x), np.asarray(y)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y == 0, TF.dtype(0), x / y).astype(TF.dtype)


class TFStandIn(types.ModuleType):
    """The TensorFlow ops `update_vectors` and `client_datasets` call, in NumPy."""

    def __init__(self):
        super().__init__("tensorflow")
        self.dtype = np.float64
        self.float32 = "float32"
        self.Variable = Variable
        self.math = types.SimpleNamespace(
            multiply=self.multiply, divide_no_nan=self.divide_no_nan, top_k=self.top_k
        )
        self.random = types.SimpleNamespace(stateless_binomial=self.stateless_binomial)
        self.availability_seed = 0
        self.drawn = {}

    def __getattr__(self, name):  # tf.data.Dataset etc. in annotations
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert()

    @staticmethod
    def function(f):
        return f

    def constant(self, v, dtype=None):
        return np.array(v, dtype=self.dtype)

    def ones(self, n):
        return np.ones(n, dtype=self.dtype)

    def ones_like(self, v):
        return np.ones_like(_val(v), dtype=self.dtype)

    @staticmethod
    def reshape(x, shape):
        return np.reshape(_val(x), shape)

    @staticmethod
    def gather(x, idx):
        return _val(x)[np.asarray(idx)]

    def multiply(self, a, b):  # TF's Mul: ∂a = grad·b, ∂b = grad·a
        out = (_val(a) * _val(b)).astype(self.dtype)
        if not (_traced(a) or _traced(b)):
            return out
        av, bv = _val(a), _val(b)
        return Node(out, ((a, lambda g: g * bv), (b, lambda g: g * av)))

    def divide_no_nan(self, x, y):
        out = _div_no_nan(_val(x), _val(y))
        if not (_traced(x) or _traced(y)):
            return out
        xv, yv = _val(x), _val(y)
        # TF's _DivNoNanGrad: ∂x = div_no_nan(grad, y); ∂y = grad·div_no_nan(div_no_nan(−x, y), y)
        return Node(out, ((x, lambda g: _div_no_nan(g, yv)),
                          (y, lambda g: g * _div_no_nan(_div_no_nan(-xv, yv), yv))))

    def reduce_sum(self, x):  # TF's Sum: ∂ = grad broadcast
        v = _val(x)
        out = self.dtype(np.sum(v))
        if not _traced(x):
            return out
        return Node(out, ((x, lambda g: np.full_like(v, g)),))

    @staticmethod
    def top_k(x, k):
        v = _val(x)
        idx = np.argsort(-v, kind="stable")[:k]  # equal values: lower index first
        return v[idx], idx

    def tensor_scatter_nd_add(self, tensor, indices, updates):
        out = np.array(_val(tensor), dtype=self.dtype)
        for i, u in zip(np.asarray(indices)[:, 0], _val(updates)):
            out[i] += u
        return out

    def stateless_binomial(self, shape, seed, counts, probs, output_dtype=None):
        rng = np.random.default_rng([self.availability_seed, int(seed[1])])
        a = (rng.random(shape) < np.asarray(probs, dtype=np.float64)).astype(self.dtype)
        self.drawn[int(seed[1])] = a
        return a

    class GradientTape:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        @staticmethod
        def gradient(target, source):
            grads = {}
            order, seen = [], set()

            def visit(n):  # topological order from the target
                if id(n) in seen or not isinstance(n, Node):
                    return
                seen.add(id(n))
                for p, _ in n.parents:
                    visit(p)
                order.append(n)

            visit(target)
            grads[id(target)] = TF.dtype(1)
            for n in reversed(order):
                g = grads.get(id(n))
                if g is None:
                    continue
                for p, fn in n.parents:
                    contrib = fn(g)
                    grads[id(p)] = grads[id(p)] + contrib if id(p) in grads else contrib
            return grads[id(source)]


TF = TFStandIn()


class ClientData:
    """`client_ids` 0..N−1; client k's "dataset" has n_k elements."""

    def __init__(self, sizes):
        self.sizes = [int(s) for s in sizes]
        self.client_ids = list(range(len(sizes)))

    def create_tf_dataset_for_client(self, cid):
        return range(self.sizes[int(cid)])


def load_authors(checkout: str):
    sys.modules["tensorflow"] = TF
    sys.modules["tensorflow_federated"] = Inert()
    absl = types.ModuleType("absl")
    absl.logging = types.SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    sys.modules["absl"] = absl
    sys.modules["absl.logging"] = absl.logging
    sys.path.insert(0, f"{checkout}/utils")
    import training_utils  # the authors' module, unchanged

    return training_utils


# --------------------------------------------------------------------------- runs


class NoQuery:
    """F3AST asks the clients nothing during selection."""


def federation(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(150), 0.6, size=n)), 50, 400).astype(int)


def authors_fn(tu, sizes, k, beta, sine):
    return tu.build_availability_client_datasets_fn(
        ClientData(sizes), k, beta, sine_wave=sine, initialize_p=True
    )


def authors_step(fn, t, r):
    _, w, r, idx, avail = fn(t) if r is None else fn(t, r)
    return r, np.asarray(idx), np.asarray(w), np.asarray(avail)


def scores(p, r):
    """The authors' rule before masking: (p²/r)/r, as TF's gradient forms it."""
    return _div_no_nan(_div_no_nan(p * p, r), r)


def fedsel_selector(fedsel, sizes, k, rounds, seed, beta):
    return fedsel.Selector("f3ast", sizes=[int(s) for s in sizes], per_round=k, rounds=rounds,
                           seed=seed, beta=beta, protocol="code")


def lockstep(tu, fedsel, sizes, k, beta, rounds, seed, sine):
    TF.availability_seed = seed
    fn = authors_fn(tu, sizes, k, beta, sine)
    sel = fedsel_selector(fedsel, sizes, k, rounds, seed, beta)
    p = np.asarray(sizes, dtype=np.float64) / np.sum(sizes)
    r = None
    out = {"rounds": rounds, "same_set": 0, "padding": 0, "near_tie": 0, "other": 0,
           "r_rel_max": 0.0, "w_rel_max": 0.0, "padding_r_rel_max": 0.0}
    for t in range(rounds):
        r_before = p.astype(TF.dtype) if r is None else r.numpy().copy()
        r, idx, w, avail = authors_step(fn, t, r)
        avail_ids = [int(i) for i in np.flatnonzero(avail)]
        if t > 0:  # fedsel's r := the authors' r before this round
            st = sel.state()
            st["selector"]["r"] = [float(x) for x in r_before]
            sel.load_state(st)
        ours = sel.select(t, avail_ids, k, NoQuery())
        sel.observe(ours)
        ours_r = np.array(sel.state()["selector"]["r"])
        ours_w = np.array(sel.weights) * k
        theirs = sorted(int(i) for i in idx)
        rel = float(np.max(np.abs(ours_r - r.numpy())) / np.max(np.abs(r.numpy())))
        if sorted(ours) == theirs:
            out["same_set"] += 1
            out["r_rel_max"] = max(out["r_rel_max"], rel)
            order = np.argsort(idx)
            wt = w[order]
            out["w_rel_max"] = max(out["w_rel_max"], float(np.max(np.abs(ours_w - wt)) / np.max(np.abs(wt))))
        elif len(avail_ids) < k:
            out["padding"] += 1
            out["padding_r_rel_max"] = max(out["padding_r_rel_max"], rel)
            assert sorted(ours) == avail_ids, (t, ours, avail_ids)
        else:
            s = scores(p.astype(TF.dtype), r_before) * avail
            kth = np.sort(s)[::-1][k - 1]
            diff = set(ours) ^ set(theirs)
            tol = 1000 * np.finfo(TF.dtype).eps
            if all(abs(s[i] - kth) <= tol * kth for i in diff):
                out["near_tie"] += 1
            else:
                out["other"] += 1
                out.setdefault("other_rounds", []).append(t)
    return out


def free_run_authors(tu, sizes, k, beta, rounds, seed, sine):
    TF.availability_seed = seed
    TF.drawn = {}
    fn = authors_fn(tu, sizes, k, beta, sine)
    counts = np.zeros(len(sizes))
    r = None
    padded = 0
    unavailable_picks = 0
    available_picks = np.zeros(len(sizes))
    for t in range(rounds):
        r, idx, _, avail = authors_step(fn, t, r)
        counts[idx] += 1
        padded += int(avail.sum() < k)
        unavailable_picks += int((avail[idx] == 0).sum())
        available_picks[idx[avail[idx] == 1]] += 1
    return counts, r.numpy().copy(), dict(TF.drawn), (padded, unavailable_picks, available_picks)


def free_run_fedsel(fedsel, sizes, k, beta, rounds, seed, drawn, pad=False):
    """`pad`: where fewer than K are available, fedsel is told that the authors' padding
    (the lowest unavailable ids) is available too, so that it takes the authors' set."""
    sel = fedsel_selector(fedsel, sizes, k, rounds, seed, beta)
    counts = np.zeros(len(sizes))
    for t in range(rounds):
        avail = [int(i) for i in np.flatnonzero(drawn[t])]
        if pad and len(avail) < k:
            avail = sorted(avail + [int(i) for i in np.flatnonzero(drawn[t] == 0)[: k - len(avail)]])
        ours = sel.select(t, avail, k, NoQuery())
        sel.observe(ours)
        counts[ours] += 1
    return counts, np.array(sel.state()["selector"]["r"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", required=True, help="a checkout of mriberodiaz/f3ast")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--beta", type=float, default=0.01, help="the authors' flag default")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--federation-seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    TF.dtype = np.float64 if args.dtype == "float64" else np.float32
    tu = load_authors(args.checkout)
    import fedsel

    n, k, beta, T, S = args.clients, args.per_round, args.beta, args.rounds, args.seeds
    sizes = federation(args.federation_seed, n)
    figures = {"clients": n, "per_round": k, "beta": beta, "rounds": T, "seeds": S,
               "dtype": args.dtype}
    for sine in (True, False):
        tag = "sine" if sine else "always"
        # lockstep on every seed
        agg = {"rounds": 0, "same_set": 0, "padding": 0, "near_tie": 0, "other": 0,
               "r_rel_max": 0.0, "w_rel_max": 0.0, "padding_r_rel_max": 0.0}
        for s in range(1, S + 1):
            o = lockstep(tu, fedsel, sizes, k, beta, T, s, sine)
            for key in ("rounds", "same_set", "padding", "near_tie", "other"):
                agg[key] += o[key]
            for key in ("r_rel_max", "w_rel_max", "padding_r_rel_max"):
                agg[key] = max(agg[key], o[key])
            if o.get("other_rounds"):
                agg.setdefault("other_rounds", []).append((s, o["other_rounds"][:5]))
        # free running
        ref, other, ours, ref_avail, padded_ours = (np.zeros(n) for _ in range(5))
        r_final_rel, first_padded, same_final, unavail = 0.0, 0, 0, 0
        for s in range(1, S + 1):
            c, r_a, drawn, padded = free_run_authors(tu, sizes, k, beta, T, s, sine)
            ref_avail += padded[2]
            ref += c
            first_padded += padded[0]
            unavail += padded[1]
            c2, r_f = free_run_fedsel(fedsel, sizes, k, beta, T, s, drawn)
            ours += c2
            padded_ours += free_run_fedsel(fedsel, sizes, k, beta, T, s, drawn, pad=True)[0]
            r_final_rel = max(r_final_rel, float(np.max(np.abs(r_f - r_a)) / np.max(r_a)))
            same_final += int(np.array_equal(c, c2))
            other += free_run_authors(tu, sizes, k, beta, T, S + s, sine)[0]
        agg["free_tv_fedsel"] = tv(ours, ref)
        agg["free_tv_floor"] = tv(other, ref)
        agg["free_tv_fedsel_vs_authors_available_picks"] = tv(ours, ref_avail)
        agg["free_tv_fedsel_given_the_padding"] = tv(padded_ours, ref)
        agg["free_r_final_rel_max"] = r_final_rel
        agg["free_seeds_same_counts"] = same_final
        agg["free_padded_rounds"] = first_padded
        agg["free_authors_unavailable_picks"] = unavail
        agg["free_authors_picks"] = int(ref.sum())
        figures[tag] = agg
        print(f"[{tag}] lockstep over {S} seeds × {T} rounds: {agg['same_set']} rounds same set "
              f"(r max rel diff {agg['r_rel_max']:.3g}, weights·K {agg['w_rel_max']:.3g}); "
              f"differing: padding {agg['padding']} (r rel diff up to {agg['padding_r_rel_max']:.3g}), "
              f"near-tie {agg['near_tie']}, other {agg['other']}"
              + (f" {agg['other_rounds']}" if agg.get("other_rounds") else ""))
        print(f"[{tag}] free running: selection-frequency TV fedsel–authors {agg['free_tv_fedsel']:.4f}, "
              f"authors' seed-to-seed {agg['free_tv_floor']:.4f} "
              f"(ratio {agg['free_tv_fedsel'] / max(agg['free_tv_floor'], 1e-300):.2f}); "
              f"final r max rel diff {r_final_rel:.3g}; seeds with identical counts {same_final}/{S}; "
              f"rounds with < K available {first_padded}, the authors' picks of unavailable clients "
              f"{unavail} of {int(ref.sum())}; TV against the authors' picks of available clients only "
              f"{agg['free_tv_fedsel_vs_authors_available_picks']:.4f}; fedsel given the authors' padding "
              f"as available: TV {agg['free_tv_fedsel_given_the_padding']:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
