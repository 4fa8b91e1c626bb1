#!/usr/bin/env python3
"""fedsel's FedGS beside the FedGS authors' own server, fed the same 3DG and availability.

The reference is `algorithm/oracle_fedgs.py` of github.com/WwZzz/FedGS (the paper's code,
easyFL-based; commit below), from a checkout the user fetched (`--checkout`): its code is
never part of this repository. FedGS is not in the `flgo` wheel on PyPI (the authors' later
framework; no `flgo` release from 0.0.29 to 0.4.4 holds FedGS or its 3DG sampler), so the
paper's repository is the reference.

Both sides get the same clients' features (`oracle_features` for fedsel; the authors'
round 0 reads them as its task's oracle features), build the 3DG from them, and are then
asked for a selection each round with the same available clients and the same budget K.
The authors' server runs as its own `iterate` runs it: round 0 builds the graph
(`create_graph_from_features` with the cosine, `create_adj_from_graph` with its default
ε = 0.01, σ = 0.1, `floyd`), each later round calls `sample` with `active_clients` set
to the round's available clients, then counts the selection in `sample_frequency`.
fedsel runs protocol `code` with the same α.

Compared (deterministic: FedGS has no random draw of its own once the availability is
fixed):
- the shortest-path matrix H of the 3DG, max |fedsel − authors| / max |authors|;
- lockstep: each round both start from the authors' selection counts (fedsel's are loaded
  with `load_state`), and the chosen sets must be equal; where they differ, the authors'
  objective Σ_{i≤j} H_ij x_i x_j (their Ht, diagonal included) at both sets says which
  solved better (relative gap). Two causes are expected and told apart by it: exact ties
  (gap at rounding level; fedsel takes its solver's first, Gurobi any), and Gurobi
  stopping within its default relative MIP gap of 1e-4 (fedsel's set better by up to
  1e-4; `--mipgap 0` removes these);
- free running: each side keeps its own counts for the whole run; the sets per round and
  the selection frequencies over the seeds (total-variation distance against the
  authors' own seed-to-seed distance, seeds 1..S against S+1..2S).

Stand-ins for the imports the sampler never uses (documented here, as they replace the
authors' modules): `algorithm.fedbase.BasicServer` (the fields `oracle_fedgs.Server` reads:
the clients, `num_clients`, `clients_per_round`, `current_round`, `local_data_vols`,
`total_data_vol`, the real `init_algo_para` logic, and a `communicate` that trains no
one and returns placeholder models); `utils.systemic_simulator.with_inactivity` (an
identity decorator: the driver sets `active_clients` itself, so the decorator's
intersection with the active set changes nothing); `utils.fmodule._model_sum` (a plain
sum of the placeholders); empty `torch`, `networkx` and `utils.fflow`. The solver is the
authors' Gurobi (`gurobipy` from PyPI, downloaded at run time, its size-limited license;
their `TimeLimit = 5` kept) with one shim: gurobipy 12 dropped `addConstr(lhs=, sense=,
rhs=)`, which their code calls, so the shim builds the same `lhs == rhs` constraint.
`--solver exact` replaces gurobipy by an exhaustive search over every M-subset (documented
stand-in, ties to the lexicographically first subset) where gurobipy cannot be had.

    git clone https://github.com/WwZzz/FedGS /tmp/FedGS && git -C /tmp/FedGS checkout 5b721c61b8f6713b536be3a791ba98262db292aa
    python scripts/reference/fedgs_authors.py --checkout /tmp/FedGS [--seeds 30] [--rounds 20]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import numpy as np

from frequency import tv
from wheels import Unavailable, download_wheel
from stand_ins import import_over

COMMIT = "5b721c61b8f6713b536be3a791ba98262db292aa"
GUROBI = "gurobipy"



# --- the solver -------------------------------------------------------------------------


def load_gurobipy(into: Path, mipgap: float | None = None):
    """gurobipy from PyPI into `into` (its wheel brings a size-limited license), with the
    `addConstr(lhs=, sense=, rhs=)` form the authors' code calls restored. `mipgap` set:
    every model gets that relative MIP gap instead of Gurobi's default 1e-4 (a
    diagnostic; the authors' code keeps the default)."""
    try:
        import gurobipy as grb  # noqa: F401  (one already installed)
    except ImportError:
        wheel = download_wheel(GUROBI, into, "gurobipy-*.whl", timeout=300)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(into / "grb")
        sys.path.insert(0, str(into / "grb"))
        try:
            import gurobipy as grb
        except ImportError as e:
            raise Unavailable(f"gurobipy does not import: {e}") from e

    class Model(grb.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if mipgap is not None:
                self.setParam("OutputFlag", 0)
                self.Params.MIPGap = mipgap

        def addConstr(self, constr=None, name="", *, lhs=None, sense=None, rhs=None):  # noqa: N802
            if sense is None:
                return super().addConstr(constr, name=name)
            built = {grb.GRB.EQUAL: lambda: lhs == rhs, grb.GRB.LESS_EQUAL: lambda: lhs <= rhs,
                     grb.GRB.GREATER_EQUAL: lambda: lhs >= rhs}[sense]()
            return super().addConstr(built, name=name)

    name = f"gurobi {grb.__version__}" + ("" if mipgap is None else f", MIPGap {mipgap:g}")
    shim = types.SimpleNamespace(Model=Model, GRB=grb.GRB, quicksum=grb.quicksum, name=name)
    try:  # the license must let a small model solve
        m = Model()
        m.setParam("OutputFlag", 0)
        x = m.addVar(vtype=grb.GRB.BINARY)
        m.addConstr(lhs=grb.quicksum([x]), sense=grb.GRB.EQUAL, rhs=1)
        m.optimize()
    except grb.GurobiError as e:
        raise Unavailable(f"gurobipy does not solve: {e}") from e
    return shim


class _Expr:
    """Expression over binary variables: `lin` {i: c} and `quad` {(i, j): c}, i <= j."""

    __array_ufunc__ = None  # numpy scalars defer to __rmul__

    def __init__(self, lin=None, quad=None):
        self.lin, self.quad = dict(lin or {}), dict(quad or {})

    def __mul__(self, other):
        if isinstance(other, _Expr):  # only products of linear terms occur
            assert not self.quad and not other.quad
            quad = {}
            for i, a in self.lin.items():
                for j, b in other.lin.items():
                    key = (min(i, j), max(i, j))
                    quad[key] = quad.get(key, 0.0) + a * b
            return _Expr(quad=quad)
        c = float(other)
        return _Expr({k: v * c for k, v in self.lin.items()}, {k: v * c for k, v in self.quad.items()})

    __rmul__ = __mul__

    def __add__(self, other):
        out = _Expr(self.lin, self.quad)
        for mine, theirs in ((out.lin, other.lin), (out.quad, other.quad)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0.0) + v
        return out

    __radd__ = __add__


class ExactModel:
    """Stand-in for `gurobipy.Model`: maximises the quadratic objective over the 0/1
    vectors with Σx = rhs by trying every subset (ties: the lexicographically first)."""

    def __init__(self, name=""):
        self.vars, self.rhs, self.objective = [], None, _Expr()
        self.Params = types.SimpleNamespace()
        self.ModelSense, self.Status, self.ObjVal = -1, None, None

    def addVar(self, vtype=None):  # noqa: N802
        v = _Expr({len(self.vars): 1.0})
        v.X = 0.0
        self.vars.append(v)
        return v

    def addConstr(self, lhs=None, sense=None, rhs=None):  # noqa: N802
        self.rhs = int(rhs)

    def setObjective(self, e):  # noqa: N802
        self.objective = e

    def setParam(self, *_):  # noqa: N802
        pass

    def optimize(self):
        n = len(self.vars)
        q = np.zeros((n, n))
        for i, c in self.objective.lin.items():
            q[i, i] += c
        for (i, j), c in self.objective.quad.items():
            q[i, j] += c  # x_i x_i = x_i
        best, arg = -np.inf, None
        for s in itertools.combinations(range(n), self.rhs):
            idx = np.array(s)
            v = q[np.ix_(idx, idx)].sum()
            if v > best:
                best, arg = v, s
        for i, v in enumerate(self.vars):
            v.X = 1.0 if i in arg else 0.0
        self.ObjVal, self.Status = best, 2


def exact_solver():
    grb = types.SimpleNamespace(BINARY="B", EQUAL="=", LESS_EQUAL="<", GREATER_EQUAL=">", MAXIMIZE=-1)
    return types.SimpleNamespace(
        Model=ExactModel, GRB=grb, quicksum=lambda xs: sum(xs, _Expr()), name="exhaustive search (stand-in)"
    )


# --- the authors' server ------------------------------------------------------------------


def load_authors(checkout: Path, solver) -> types.ModuleType:
    """`algorithm/oracle_fedgs.py` of the checkout, its unused imports stood in for."""
    src = checkout / "algorithm" / "oracle_fedgs.py"
    if not src.is_file():
        raise Unavailable(f"{src} is missing: pass --checkout, a clone of WwZzz/FedGS at {COMMIT}")

    class BasicServer:
        def __init__(self, option, model, clients, test_data=None):
            self.option, self.model, self.clients, self.test_data = option, model, clients, test_data
            self.num_clients = len(clients)
            self.clients_per_round = max(int(self.num_clients * option["proportion"]), 1)
            self.current_round = 0
            self.local_data_vols = [c.datavol for c in clients]
            self.total_data_vol = sum(self.local_data_vols)
            self.active_clients = list(range(self.num_clients))

        def init_algo_para(self, algo_paras):  # fedbase.BasicServer.init_algo_para
            if len(self.algo_para) == 0:
                return
            elif algo_paras is not None:
                assert len(self.algo_para) == len(algo_paras)
                for para_name, value in zip(self.algo_para.keys(), algo_paras):
                    self.algo_para[para_name] = type(self.algo_para[para_name])(value)
            for para_name, value in self.algo_para.items():
                self.__setattr__(para_name, value)

        def communicate(self, selected_clients):
            return {"model": [0.0 for _ in selected_clients]}

    stubs = {
        "torch": types.ModuleType("torch"),
        "networkx": types.ModuleType("networkx"),
        "utils": types.ModuleType("utils"),
        "utils.fflow": types.ModuleType("utils.fflow"),
        "utils.fmodule": types.ModuleType("utils.fmodule"),
        "utils.systemic_simulator": types.ModuleType("utils.systemic_simulator"),
        "algorithm": types.ModuleType("algorithm"),
        "algorithm.fedbase": types.ModuleType("algorithm.fedbase"),
        "gurobipy": types.ModuleType("gurobipy"),
    }
    stubs["utils.fmodule"]._model_sum = lambda ms: sum(ms)
    stubs["utils.systemic_simulator"].with_inactivity = lambda f: f
    for name in ("fflow", "fmodule", "systemic_simulator"):
        setattr(stubs["utils"], name, stubs[f"utils.{name}"])
    stubs["algorithm"].__path__ = []
    stubs["algorithm.fedbase"].BasicServer = BasicServer
    stubs["algorithm.fedbase"].BasicClient = object
    module = import_over("algorithm.oracle_fedgs", src, stubs)
    module.grb = solver
    module.solver_name = solver.name
    return module


class _Client:
    """What `get_client_feature('oracle')` reads of a client: on a synthetic task the
    flattened locally optimal model, otherwise the labels of its training samples."""

    def __init__(self, feature, labels, datavol):
        self.datavol = datavol
        self.train_data = types.SimpleNamespace(optimal_model=feature) if labels is None else [(0, y) for y in labels]


def authors_server(authors, fed: dict, k: int, alpha: float):
    clients = [_Client(f, lab, s) for f, lab, s in zip(fed["features"], fed["labels"], fed["sizes"])]
    task = "synthetic_regression" if fed["labels"][0] is None else "fashion_classification"
    server = authors.Server({"algo_para": [alpha], "task": task, "proportion": 0.0}, None, clients)
    server.clients_per_round = k
    server.current_round = 0
    server.iterate(0)  # the 3DG
    return server


def authors_round(server, available: list[int]) -> list[int]:
    server.current_round += 1
    server.active_clients = list(available)
    server.iterate(server.current_round)
    return sorted(int(c) for c in server.selected_clients)


def authors_objective(server, available: list[int], counts, chosen) -> float:
    """Σ_{i≤j} Ht_ij x_i x_j as the authors' `sample` builds Ht (with counts `counts`)."""
    n, big_n = len(available), server.num_clients
    m = min(n, server.clients_per_round)
    if n == 1 or m < 2:
        return 0.0
    ht = server.alpha * 2.0 / (m * (m - 1)) * server.shortest_dist[available, :][:, available]
    vt = np.array(counts, dtype=float)
    ut = -1.0 / (big_n - 1) * (2 * (vt - vt.mean() - 1.0 * m / n) + 1)[available]
    ht[np.diag_indices(n)] = ut
    x = np.array([1.0 if c in set(chosen) else 0.0 for c in available])
    return float(x @ np.triu(ht) @ x)


# --- the federation -----------------------------------------------------------------------


def federation(seed: int, n: int, kind: str) -> dict:
    """n clients. `synthetic`: features are locally optimal models around 5 cluster centres
    (d = 20), as the authors' Synthetic task feeds its oracle graph. `labels`: 10 classes,
    two per client in random proportions, the histogram of its training labels (FMNIST's
    two-label shards). `shards`: the same with the two labels in equal halves (sizes made
    even), as the authors' partition splits a label equally among its holders: clients
    with the same pair have the same features, so the 3DG has exact ties. Availability rates as the authors' LogNormal mode: T_k / max T,
    T ~ LogNormal(0, 0.5)."""
    rng = np.random.default_rng(20_000 + seed)
    sizes = [int(s) for s in rng.integers(50, 401, n)]
    if kind == "shards":
        sizes = [s + s % 2 for s in sizes]
    if kind == "synthetic":
        centres = rng.normal(size=(5, 20))
        feats = [centres[rng.integers(5)] + 0.5 * rng.normal(size=20) for _ in range(n)]
        labels = [None] * n
    else:
        labels, feats = [], []
        for k in range(n):
            pair = rng.choice(10, 2, replace=False)
            first = int(rng.integers(1, sizes[k])) if kind == "labels" else sizes[k] // 2
            ys = [int(pair[0])] * first + [int(pair[1])] * (sizes[k] - first)
            labels.append(ys)
            feats.append(np.bincount(ys, minlength=10) / len(ys))
    t = rng.lognormal(0.0, 0.5, n)
    return {"features": [np.asarray(f, dtype=float) for f in feats], "labels": labels, "sizes": sizes, "rates": t / t.max()}


def availability(fed: dict, seed: int, r: int) -> list[int]:
    """Round r's available clients: u ≤ rate per client, drawn again until one is."""
    rs = np.random.RandomState(1_000_003 * seed + r)
    while True:
        a = [c for c, p in enumerate(fed["rates"]) if rs.random_sample() <= p]
        if a:
            return a


# --- the comparison ---------------------------------------------------------------------------


def fedsel_selector(fed: dict, k: int, rounds: int, alpha: float):
    import fedsel

    return fedsel.Selector(
        "fedgs", sizes=fed["sizes"], per_round=k, rounds=rounds, seed=0,
        oracle_features=[list(map(float, f)) for f in fed["features"]], protocol="code", alpha=alpha,
    )


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def run_seed(authors, fed: dict, seed: int, rounds: int, k: int, alpha: float) -> dict:
    """One seed, lockstep and free running. Returns the figures and both sides' counts."""
    out = {"rounds": 0, "equal_lockstep": 0, "equal_free": 0, "gaps": [], "h_rel": 0.0, "diffs": []}
    # Lockstep: fedsel takes the authors' counts before each round.
    ref = authors_server(authors, fed, k, alpha)
    ours = fedsel_selector(fed, k, rounds, alpha)
    for r in range(rounds):
        a = availability(fed, seed, r)
        counts = list(ref.sample_frequency)
        if r > 0:
            st = ours.state()
            st["selector"]["counts"] = counts
            ours.load_state(st)
        mine = sorted(int(c) for c in ours.select(r, available=a, budget=k, query=None))
        ours.observe(mine)
        if r == 0:
            h = np.array(ours.state()["selector"]["distances"])
            out["h_rel"] = rel(h, ref.shortest_dist)
        theirs = authors_round(ref, a)
        out["rounds"] += 1
        if mine == theirs:
            out["equal_lockstep"] += 1
        else:
            o_ref = authors_objective(ref, a, counts, theirs)
            o_ours = authors_objective(ref, a, counts, mine)
            out["gaps"].append((o_ours - o_ref) / abs(o_ref))
            out["diffs"].append((r, theirs, mine, o_ref, o_ours))
    # Free running: each side its own counts.
    ref = authors_server(authors, fed, k, alpha)
    ours = fedsel_selector(fed, k, rounds, alpha)
    for r in range(rounds):
        a = availability(fed, seed, r)
        mine = sorted(int(c) for c in ours.select(r, available=a, budget=k, query=None))
        ours.observe(mine)
        out["equal_free"] += mine == authors_round(ref, a)
    out["counts_ref"] = np.array(ref.sample_frequency, dtype=float)
    out["counts_ours"] = np.array(ours.state()["selector"]["counts"], dtype=float)
    return out


def compare(
    authors, kind: str, n: int, k: int, alpha: float, seeds: int, rounds: int, fed_seed: int = 1, spread: bool = True
) -> dict:
    """Every figure of one federation over `seeds` availability streams; `spread=False`
    leaves out the authors' own seed-to-seed distance (a third run of their server)."""
    fed = federation(fed_seed, n, kind)
    ref, other, ours = np.zeros(n), np.zeros(n), np.zeros(n)
    total = {"rounds": 0, "equal_lockstep": 0, "equal_free": 0, "gaps": [], "h_rel": 0.0, "diffs": []}
    for s in range(1, seeds + 1):
        o = run_seed(authors, fed, s, rounds, k, alpha)
        for key in ("rounds", "equal_lockstep", "equal_free"):
            total[key] += o[key]
        total["gaps"] += o["gaps"]
        total["diffs"] += [(s, *d) for d in o["diffs"]]
        total["h_rel"] = max(total["h_rel"], o["h_rel"])
        ref += o["counts_ref"]
        ours += o["counts_ours"]
        if spread:
            other += run_seed_free_ref(authors, fed, seeds + s, rounds, k, alpha)
    total.update(
        kind=kind, n=n, k=k, alpha=alpha, seeds=seeds, solver=authors.solver_name,
        tv_fedsel=tv(ours, ref), tv_reference=tv(other, ref) if spread else float("nan"),
        worst_gap=min(total["gaps"], default=0.0), best_gap=max(total["gaps"], default=0.0),
    )
    return total


def run_seed_free_ref(authors, fed: dict, seed: int, rounds: int, k: int, alpha: float) -> np.ndarray:
    ref = authors_server(authors, fed, k, alpha)
    for r in range(rounds):
        authors_round(ref, availability(fed, seed, r))
    return np.array(ref.sample_frequency, dtype=float)


def report(r: dict) -> str:
    lines = [
        f"{r['kind']}: N = {r['n']}, K = {r['k']}, α = {r['alpha']}, {r['seeds']} seeds, solver {r['solver']}",
        f"  H (3DG shortest paths): max relative difference {r['h_rel']:.2e}",
        f"  lockstep (same counts): {r['equal_lockstep']} of {r['rounds']} rounds choose the same set",
    ]
    if r["gaps"]:
        lines.append(
            f"    where they differ, the authors' objective at fedsel's set minus at theirs, relative: "
            f"from {r['worst_gap']:.2e} to {r['best_gap']:.2e}"
        )
        for s, rr, theirs, mine, o_ref, o_ours in r["diffs"][:5]:
            lines.append(f"    seed {s} round {rr}: authors {theirs} ({o_ref:.12g}), fedsel {mine} ({o_ours:.12g})")
    lines.append(f"  free running: {r['equal_free']} of {r['rounds']} rounds choose the same set")
    lines.append(
        f"  selection frequencies: TV(fedsel, authors) {r['tv_fedsel']:.4f}, authors seed to seed {r['tv_reference']:.4f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help=f"a clone of WwZzz/FedGS at {COMMIT}")
    p.add_argument("--solver", choices=["auto", "gurobi", "exact"], default="auto")
    p.add_argument("--mipgap", type=float, help="Gurobi's relative MIP gap (default: Gurobi's, 1e-4, as the authors ran it)")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=30)
    p.add_argument("--per-round", type=int, default=6)
    p.add_argument("--alpha", type=float, nargs="+", default=[1.0, 0.1])
    p.add_argument("--kinds", nargs="+", choices=["synthetic", "labels", "shards"], default=["synthetic", "labels", "shards"])
    p.add_argument("--ratio", type=float, default=1.5)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            solver = exact_solver() if a.solver == "exact" else load_gurobipy(Path(tmp), a.mipgap)
        except Unavailable as e:
            if a.solver == "gurobi":
                print(f"skipped: {e}")
                return 0
            print(f"gurobipy unavailable ({e}); using the exhaustive stand-in")
            solver = exact_solver()
        try:
            authors = load_authors(a.checkout, solver)
        except Unavailable as e:
            print(f"skipped: {e}")
            return 0
        ok = True
        for kind in a.kinds:
            for alpha in a.alpha:
                r = compare(authors, kind, a.clients, a.per_round, alpha, a.seeds, a.rounds)
                print(report(r))
                ok &= r["h_rel"] <= 1e-9 and r["worst_gap"] >= -1e-12
                ok &= r["tv_fedsel"] <= a.ratio * r["tv_reference"] or r["tv_fedsel"] == 0.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
