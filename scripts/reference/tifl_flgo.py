#!/usr/bin/env python3
"""fedsel's TiFL beside FLGo's, fed the same federation and the same per-tier accuracies.

The reference is `flgo/algorithm/TiFL.py` of the `flgo` 0.4.4 wheel on PyPI (FLGo's
unofficial TiFL, after bacox/fltk), downloaded into a temporary directory at run time: its
code is never part of this repository. The file is imported over stand-ins for what it
imports but the selection never calls (`flgo.algorithm.fedbase`: a `BasicServer` whose
`init_algo_para` sets the options as attributes, a `BasicClient`), and its `Server.iterate`
runs unchanged round by round (`current_round` 1-based, as `BasicServer.run` counts) on a
harness subclass that answers what `iterate` asks of `BasicServer`: `communicate` trains the
distinct selected clients (`list(set(...))`, `fedbase.py:379`) that are available,
`aggregate` does nothing, `global_test(flag='val')` returns every client's accuracy after
the round. FLGo's global NumPy generator is seeded with the run's seed. One adaptation:
`int(np.random.choice(tiers, 1, p=probs))` (`TiFL.py:62`) is a TypeError under NumPy 2.4, so
the module's `np.random.choice` returns its (unchanged) draw as an array whose one-element
int() works as under NumPy 1.x.

fedsel's side is `fedsel.Selector("tifl", sizes=, per_round=K, rounds=R, seed=s,
durations=, protocol="code", T=5, I=10, C=--C)`, FLGo's defaults T, I (`TiFL.py:16`) and the
credit skew `--C` (0, FLGo's default). `code` is the protocol that follows FLGo: the tiers
are built before round 0 from the round trips given as `durations` (FLGo's `c._latency`),
the probabilities change at every evaluation (rounds r ≥ I with r mod I = 0), a tier's
accuracy is the plain mean of its clients' values (the sizes, all 100, are used for
nothing), and a tier's clients are min(K, |tier|) uniform draws with replacement among its
available ones, deduplicated (tifl.rs `select`), as FLGo draws (`TiFL.py:66`) and trains
(`fedbase.py:379`): the distinct picks per round are compared like for like, by the
distribution of their count. FLGo's `init_algo_para` casts an option to its default's type
(`fedbase.py:703`: C's default is the int 0, so any C < 1 given through `algo_para` becomes
0); the harness sets the server's `C` after `initialize()` instead. Under C > 0 the credits
are drawn (a Dirichlet) by each side's own generator, so the lockstep is not run and the
credits are compared by their mean per tier.

The feedback: client k's accuracy is a0_k + (0.95 − a0_k)(1 − 0.97^m), a0_k ~ U(0.1, 0.6)
fixed per federation and m the number of rounds in which some client of k's latency group
(the T groups np.array_split makes of the clients sorted by latency) trained (`--feedback
tier`, the default), or k's own participations (`--feedback client`, where the
within-tier draw changes the feedback too). fedsel's query answers `losses(clients)`
with 1 − accuracy (its tiers rank by held-out loss descending for FLGo's accuracy
ascending; the tier mean of 1 − a is 1 − the tier mean of a).

fedsel departs from FLGo on purpose (the module doc of crates/fedsel/src/select/tifl.rs);
the comparison that judges fedsel gives FLGo the same departures, so that what remains is
what fedsel got wrong:
- "split": N not divisible by T, np.split refuses (`TiFL.py:24`); fedsel splits as
  np.array_split. Given to FLGo by its module's `np.split` resolving to `np.array_split`
  (the same for the credit cut at `TiFL.py:39`, which passes indices);
- "availability": FLGo ignores availability (an unavailable pick just does not train);
  fedsel draws a tier only among those with credits and an available client, its clients
  from the tier's available ones, and a tier's accuracy from its available clients (asked
  at the round that reads it). Given to FLGo by a subclass `sample` that calls FLGo's on a
  view of the eligible tiers (their probabilities renormalised, their clients the available
  ones; FLGo's redraw-until-credit loop is the same law) and by its module's `np.array`
  masking the unavailable clients' accuracies (NaN) so that `TiFL.py:56` averages the rest.
  (FLGo then draws min(K, pool) times, fedsel min(K, |tier|), as FLGo as it is does: equal
  while the pools hold ≥ K; the lockstep counts the rounds where they do not.)
The figures against FLGo as it is are printed too (`as is`, and as is for each departure
alone; "split" as is refuses N not divisible by T, which is printed as such).

Compared, on each federation (N clients with log-normal round trips, median 50 s, σ 0.8;
each client available with probability q each round, the same draw for both):
  - lockstep, every seed (C = 0 only): FLGo (given the departures) is handed fedsel's draws
    as the results of its `np.random.choice` (the tier, after checking FLGo still has credit
    for it; the clients, fedsel's distinct picks repeated up to the number of draws FLGo asks
    for, after checking they are in that tier's pool and no more than that number); then the
    tiers (clients, exactly; mean latencies to 1e-12), the credits after every round and the
    tier probabilities every round must be equal;
  - free running, over S seeds × R rounds: the total-variation distance (TV) between
    fedsel's (seeds 1..S) and FLGo's (1..S) per-client selection counts, against FLGo's own
    (S+1..2S against 1..S); the same for the tier schedule (how often each tier was drawn in
    each interval of I rounds: with C = 0 every tier is drawn exactly R/T times, so only the
    order, which the probabilities set, can differ); the same for the number of distinct
    picks per round (its histogram over 0..K: printed, not judged, its floor is small and
    noisy); the mean distinct picks per round, in standard errors apart; each tier's share of
    the picks, and under C > 0 each tier's mean credits.
Exits 1 when the clients' or the schedule's TV of fedsel exceeds `--ratio` × FLGo's own, or
the mean distinct picks per round differ by more than `--z` (4) standard errors, on any
federation (FLGo given the departures), or when a lockstep comparison differs. (How sensitive: FLGo against
itself with its ranking reversed gives a schedule ratio of 1.8, with its probabilities left
uniform 1.2, which only the lockstep catches.)

    python scripts/reference/tifl_flgo.py [--seeds 30] [--rounds 200] [--per-round 10] [--clients 150 153] [--availability 1.0 0.8] [--feedback tier|client] [--C 0] [--ratio 1.5] [--z 4]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from frequency import tv
from wheels import Unavailable, download_wheel
from stand_ins import import_over

WHEEL = "flgo==0.4.4"
SOURCE = "flgo/algorithm/TiFL.py"
T, I = 5, 10  # FLGo's defaults (TiFL.py:16) and fedsel's; C is `--C`
DEPARTURES = frozenset({"split", "availability"})



class Mismatch(RuntimeError):
    """FLGo, handed fedsel's draw, could not have made it."""


def load_flgo_tifl(into: Path):
    """Downloads the flgo 0.4.4 wheel into `into` and imports `flgo/algorithm/TiFL.py`."""
    wheel = download_wheel(WHEEL, into, "flgo-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extract(SOURCE, into / "pkg")
    # What TiFL.py imports: `from .fedbase import BasicServer, BasicClient`.
    flgo = types.ModuleType("flgo")
    flgo.__path__ = []
    algorithm = types.ModuleType("flgo.algorithm")
    algorithm.__path__ = []
    fedbase = types.ModuleType("flgo.algorithm.fedbase")

    class BasicServer:
        def init_algo_para(self, algo_para: dict):
            # fedbase.py:673: the options become attributes (no `option['algo_para']` here).
            self.algo_para = algo_para
            for k, v in algo_para.items():
                setattr(self, k, v)

    class BasicClient:
        pass

    fedbase.BasicServer, fedbase.BasicClient = BasicServer, BasicClient
    stand_ins = {"flgo": flgo, "flgo.algorithm": algorithm, "flgo.algorithm.fedbase": fedbase}
    return import_over("flgo.algorithm.TiFL", into / "pkg" / SOURCE, stand_ins)


@dataclass
class Federation:
    durations: list[float]
    sizes: list[int]
    a0: np.ndarray
    available: np.ndarray  # rounds × N, bool
    group: np.ndarray  # each client's latency group (np.array_split of the latency order)

    @staticmethod
    def build(n: int, q: float, rounds: int, seed: int = 1) -> "Federation":
        rng = np.random.default_rng(20_000 + 1000 * seed + n)
        durations = np.exp(rng.normal(math.log(50.0), 0.8, n))
        group = np.empty(n, dtype=int)
        for g, members in enumerate(np.array_split(np.argsort(durations, kind="stable"), T)):
            group[members] = g
        return Federation(
            durations=[float(d) for d in durations],
            sizes=[100] * n,
            a0=rng.uniform(0.1, 0.6, n),
            available=rng.random((rounds, n)) < q,
            group=group,
        )


class Accuracy:
    """The feedback: each client's accuracy, a deterministic function of participations."""

    def __init__(self, fed: Federation, feedback: str):
        self.fed, self.feedback = fed, feedback
        self.m = np.zeros(len(fed.durations))

    def trained(self, clients):
        clients = sorted(set(int(c) for c in clients))
        if not clients:
            return
        if self.feedback == "client":
            self.m[clients] += 1
        else:
            for g in set(self.fed.group[clients]):
                self.m[self.fed.group == g] += 1

    def values(self) -> np.ndarray:
        return self.fed.a0 + (0.95 - self.fed.a0) * (1.0 - 0.97**self.m)


class Evaluated(list):
    """`global_test`'s accuracies, NaN where the client is not asked (masked by `np.array`)."""


class OneElement(np.ndarray):
    """An array whose int() works when it holds one element, as under NumPy 1.x: FLGo's
    `int(np.random.choice(tiers, 1, p=probs))` (`TiFL.py:62`) is a TypeError under NumPy 2.4."""

    def __int__(self):
        return int(self.reshape(-1)[0]) if self.size == 1 else super().__int__()


def numpy_for(departures, script=None):
    """The `np` FLGo's module sees: NumPy, with `random.choice`'s arrays `OneElement`,
    `split` as `array_split` ("split"), `array` masking `Evaluated` NaNs ("availability"),
    and `random.choice` answered from `script` (lockstep) where given."""
    ns = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    if "split" in departures:
        ns.split = np.array_split

    def array(x, *a, **kw):
        if isinstance(x, Evaluated):
            return np.ma.masked_invalid(np.asarray(list(x), dtype=float))
        return np.array(x, *a, **kw)

    ns.array = array
    rnd = types.SimpleNamespace(**{k: getattr(np.random, k) for k in dir(np.random) if not k.startswith("__")})
    draw = script if script is not None else np.random.choice
    rnd.choice = lambda *a, **kw: np.asarray(draw(*a, **kw)).view(OneElement)
    ns.random = rnd
    return ns


def harness(module, departures):
    """FLGo's `Server` with what `iterate` asks of `BasicServer`, and the "availability"
    departure in `sample`."""

    class Harness(module.Server):
        def setup(self, fed: Federation, k: int, rounds: int, acc: Accuracy, c: float):
            self.clients = [types.SimpleNamespace(_latency=d) for d in fed.durations]
            self.num_rounds, self.clients_per_round = rounds, k
            self.fed, self.acc = fed, acc
            self.initialize()
            self.C = c  # not through `algo_para`, which would cast it to int (fedbase.py:703)
            self.trained_now: list[int] = []
            return self

        def available_at(self, r0: int) -> np.ndarray:
            return self.fed.available[min(r0, len(self.fed.available) - 1)]

        def sample(self):
            if "availability" not in departures:
                return super().sample()
            avail = self.available_at(self.current_round - 1)
            full = self.tiers
            eligible = [t for t in full if full[t]["credit"] > 0 and avail[full[t]["clients"]].any()]
            if not eligible:
                return []
            total = sum(full[t]["prob"] for t in eligible)
            self.tiers = {
                t: dict(full[t], clients=full[t]["clients"][avail[full[t]["clients"]]], prob=full[t]["prob"] / total)
                for t in eligible
            }
            try:
                return super().sample()
            finally:
                for t in eligible:
                    full[t]["credit"] = self.tiers[t]["credit"]
                self.tiers = full

        def communicate(self, selected_clients, *a, **kw):
            avail = self.available_at(self.current_round - 1)
            self.trained_now = [int(c) for c in set(selected_clients) if avail[c]]
            self.acc.trained(self.trained_now)
            return {"model": []}

        def aggregate(self, models, *a, **kw):
            return None

        def global_test(self, model=None, flag="val"):
            values = self.acc.values()
            if "availability" in departures:
                # Read at the next round (TiFL.py:48): only its available clients are asked.
                values = np.where(self.available_at(self.current_round), values, np.nan)
                return {"accuracy": Evaluated(values.tolist())}
            return {"accuracy": values.tolist()}

    return Harness


class Losses:
    """fedsel's query: the held-out loss as 1 − accuracy."""

    def __init__(self, acc: Accuracy):
        self.acc = acc

    def losses(self, clients):
        v = self.acc.values()
        return [float(1.0 - v[c]) for c in clients]


def run_fedsel(fed: Federation, seed: int, rounds: int, k: int, feedback: str, c: float):
    """fedsel's picks, and per round the drawn tier, the tier probabilities and credits."""
    import fedsel

    sel = fedsel.Selector(
        "tifl", sizes=fed.sizes, per_round=k, rounds=rounds, seed=seed, durations=fed.durations,
        protocol="code", T=T, I=I, C=c,
    )
    acc = Accuracy(fed, feedback)
    q = Losses(acc)
    log = []
    for r in range(rounds):
        available = [int(c) for c in np.flatnonzero(fed.available[r])]
        picked = [int(c) for c in sel.select(r, available=available, budget=k, query=q)]
        s = sel.state()["selector"]
        tiers = s["tiers"]
        log.append({
            "picked": picked,
            "tier": s["current"] if picked else None,
            "prob": [t["prob"] for t in tiers],
            "credit": [t["credit"] for t in tiers],
            "tiers": [(t["clients"], t["latency"]) for t in tiers] if r == 0 else None,
            "draws": min(k, len(tiers[s["current"]]["clients"])) if picked else 0,
        })
        acc.trained(picked)
        sel.observe(picked)
    return log


def run_flgo(module, fed: Federation, seed: int, rounds: int, k: int, feedback: str, c: float, departures, fedsel_log=None):
    """FLGo's picks per round, free running (seeded) or handed fedsel's draws (`fedsel_log`);
    in lockstep also the mismatches."""
    np.random.seed(seed)
    script_state = {"round": 0, "calls": 0}

    def script(a, size=None, *rest, **kw):
        entry = fedsel_log[script_state["round"]]
        script_state["calls"] += 1
        if script_state["calls"] == 1:
            if entry["tier"] is None or entry["tier"] not in list(a):
                raise Mismatch(f"round {script_state['round']}: FLGo draws among tiers {list(a)}, fedsel drew {entry['tier']}")
            return np.array([entry["tier"]])
        if script_state["calls"] == 2:
            picked = entry["picked"]
            if size < len(picked) or not set(picked) <= set(int(x) for x in a):
                raise Mismatch(f"round {script_state['round']}: FLGo draws {size} of its pool, fedsel picked {picked}")
            mism["count"] += size != entry["draws"]
            # fedsel's distinct picks, as `size` draws with replacement.
            return np.array(picked + picked[:1] * (size - len(picked)))
        raise Mismatch(f"round {script_state['round']}: FLGo redraws a tier (no credit left for fedsel's)")

    module.np = numpy_for(departures, script if fedsel_log is not None else None)
    acc = Accuracy(fed, feedback)
    server = harness(module, departures)().setup(fed, k, rounds, acc, c)
    out, drawn, mism = [], [], {"tiers": 0, "credit": 0, "prob": 0, "draw": 0, "count": 0, "max_prob_diff": 0.0}
    for r in range(rounds):
        server.current_round = r + 1
        script_state.update(round=r, calls=0)
        if fedsel_log is not None and fedsel_log[r]["tier"] is None:
            # fedsel selected nobody: FLGo (given the departures) must find no tier either.
            server.tiers = server.tiers or server.profiling_and_tiering()
            avail = fed.available[r]
            if any(t["credit"] > 0 and avail[t["clients"]].any() for t in server.tiers.values()):
                mism["draw"] += 1
            out.append([])
            drawn.append(None)
            continue
        try:
            server.iterate()
        except Mismatch:
            mism["draw"] += 1
            return out, drawn, mism, None
        out.append(server.trained_now)
        drawn.append(int(server.current_tier) if server.trained_now or server.selected_clients else None)
        if fedsel_log is not None:
            e, tiers = fedsel_log[r], server.tiers
            if r == 0:
                ok = len(e["tiers"]) == len(tiers) and all(
                    list(map(int, tiers[t]["clients"])) == e["tiers"][t][0]
                    and abs(tiers[t]["ave_latency"] - e["tiers"][t][1]) <= 1e-12 * e["tiers"][t][1]
                    for t in tiers
                )
                mism["tiers"] += not ok
            mism["credit"] += [tiers[t]["credit"] for t in tiers] != e["credit"]
            probs = [tiers[t]["prob"] for t in tiers]
            mism["prob"] += probs != e["prob"]
            mism["max_prob_diff"] = max(mism["max_prob_diff"], max(abs(a - b) for a, b in zip(probs, e["prob"])))
    return out, drawn, mism, credits_at_start(server.tiers, drawn)


def counts_of(n: int, rounds_picks) -> np.ndarray:
    c = np.zeros(n)
    for picks in rounds_picks:
        for k in set(picks):
            c[k] += 1
    return c


def schedule(drawn, rounds: int) -> np.ndarray:
    """Per interval of I rounds, how often each tier was drawn (flattened)."""
    d = np.zeros((math.ceil(rounds / I), T))
    for r, t in enumerate(drawn):
        if t is not None:
            d[r // I, t] += 1
    return d.reshape(-1)


def credits_at_start(tiers, drawn) -> np.ndarray | None:
    """Each tier's credits when built: what is left after the run plus its draws."""
    if not tiers:
        return None
    left = np.array([tiers[t]["credit"] for t in sorted(tiers)], dtype=float)
    return left + np.bincount([t for t in drawn if t is not None], minlength=len(left))


def picks_histogram(rounds_picks, k: int) -> np.ndarray:
    """How many rounds had 0..K distinct picks."""
    return np.bincount([len(set(p)) for p in rounds_picks], minlength=k + 1)[: k + 1].astype(float)


def picks_z(a: np.ndarray, b: np.ndarray) -> float:
    """How many standard errors apart the mean distinct picks per round of two histograms are."""
    d = np.arange(len(a))
    mean = [(h * d).sum() / h.sum() for h in (a, b)]
    var = [(h * (d - m) ** 2).sum() / (h.sum() - 1) / h.sum() for h, m in zip((a, b), mean)]
    se = math.sqrt(sum(var))
    return abs(mean[0] - mean[1]) / se if se > 0 else (0.0 if mean[0] == mean[1] else math.inf)


def tier_shares(fed: Federation, counts: np.ndarray) -> list[float]:
    return [float(counts[fed.group == g].sum() / counts.sum()) for g in range(T)]


def compare(module, fed: Federation, seeds: int, rounds: int, k: int, feedback: str, c: float, departures, lockstep: bool):
    n = len(fed.durations)
    ours, ref, other = np.zeros(n), np.zeros(n), np.zeros(n)
    sched = [np.zeros(math.ceil(rounds / I) * T) for _ in range(3)]
    hist = [np.zeros(k + 1) for _ in range(3)]
    credits = [np.zeros(T) for _ in range(2)]
    picks_ours = picks_ref = 0
    mism = {"tiers": 0, "credit": 0, "prob": 0, "draw": 0, "count": 0, "max_prob_diff": 0.0}
    for s in range(1, seeds + 1):
        log = run_fedsel(fed, s, rounds, k, feedback, c)
        ours += counts_of(n, [e["picked"] for e in log])
        sched[0] += schedule([e["tier"] for e in log], rounds)
        hist[0] += picks_histogram([e["picked"] for e in log], k)
        picks_ours += sum(len(e["picked"]) for e in log)
        drawn = np.bincount([e["tier"] for e in log if e["tier"] is not None], minlength=T)
        credits[0] += np.array(log[-1]["credit"], dtype=float) + drawn
        if lockstep:
            _, _, m, _ = run_flgo(module, fed, s, rounds, k, feedback, c, departures, log)
            for key in ("tiers", "credit", "prob", "draw", "count"):
                mism[key] += m[key]
            mism["max_prob_diff"] = max(mism["max_prob_diff"], m["max_prob_diff"])
        a, d, _, cr = run_flgo(module, fed, s, rounds, k, feedback, c, departures)
        ref += counts_of(n, a)
        sched[1] += schedule(d, rounds)
        hist[1] += picks_histogram(a, k)
        picks_ref += sum(len(p) for p in a)
        credits[1] += cr
        a, d, _, _ = run_flgo(module, fed, seeds + s, rounds, k, feedback, c, departures)
        other += counts_of(n, a)
        sched[2] += schedule(d, rounds)
        hist[2] += picks_histogram(a, k)
    return {
        "tv_fedsel": tv(ours, ref),
        "tv_reference": tv(other, ref),
        "tv_sched_fedsel": tv(sched[0], sched[1]),
        "tv_sched_reference": tv(sched[2], sched[1]),
        "tv_picks_fedsel": tv(hist[0], hist[1]),
        "tv_picks_reference": tv(hist[2], hist[1]),
        "z_picks": picks_z(hist[0], hist[1]),
        "credits_fedsel": (credits[0] / seeds).tolist(),
        "credits_flgo": (credits[1] / seeds).tolist(),
        "shares_fedsel": tier_shares(fed, ours),
        "shares_flgo": tier_shares(fed, ref),
        "per_round_fedsel": picks_ours / (seeds * rounds),
        "per_round_flgo": picks_ref / (seeds * rounds),
        "mismatch": mism,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--clients", type=int, nargs="+", default=[150, 153])
    p.add_argument("--availability", type=float, nargs="+", default=[1.0, 0.8], help="per-round availability q of each federation")
    p.add_argument("--feedback", choices=["tier", "client"], default="tier")
    p.add_argument("--C", type=float, default=0.0, help="credit skew C in [0, 1), both sides (FLGo's default 0)")
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--z", type=float, default=4.0, help="standard errors the mean distinct picks per round may differ by")
    a = p.parse_args(argv)
    if not 0.0 <= a.C < 1.0:
        p.error("--C must be in [0, 1)")
    if len(a.availability) == 1:
        a.availability *= len(a.clients)
    if len(a.availability) != len(a.clients):
        p.error("give one --availability per --clients, or one for all")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            module = load_flgo_tifl(Path(tmp))
        except Unavailable as e:
            print(f"skipped: {e}")
            return 0
        failed = False
        for n, q in zip(a.clients, a.availability):
            fed = Federation.build(n, q, a.rounds)
            relevant = {d for d in DEPARTURES if (d == "split" and n % T) or (d == "availability" and q < 1.0)}
            cases = [("with fedsel's departures", DEPARTURES)]
            cases += [(f"as is for {d}", DEPARTURES - {d}) for d in sorted(relevant)]
            if len(relevant) > 1:
                cases += [("as is", frozenset())]
            head = f"N={n}, q={q:g}, K={a.per_round}, T={T}, I={I}, C={a.C:g}, R={a.rounds}, S={a.seeds}, feedback {a.feedback}"
            for label, given in cases:
                try:
                    r = compare(module, fed, a.seeds, a.rounds, a.per_round, a.feedback, a.C, given,
                                lockstep=given == DEPARTURES and a.C == 0)
                except ValueError as e:
                    print(f"{head}; FLGo {label}: refused ({e})")
                    continue
                ratio = r["tv_fedsel"] / r["tv_reference"]
                ratio_s = r["tv_sched_fedsel"] / r["tv_sched_reference"]
                ratio_p = r["tv_picks_fedsel"] / r["tv_picks_reference"]
                line = (
                    f"{head}; FLGo {label}: clients TV(fedsel, FLGo) {r['tv_fedsel']:.3f}, FLGo seed to seed "
                    f"{r['tv_reference']:.3f} (ratio {ratio:.2f}); tiers by interval TV {r['tv_sched_fedsel']:.3f}, "
                    f"FLGo {r['tv_sched_reference']:.3f} (ratio {ratio_s:.2f}); tier shares fastest first fedsel "
                    f"{' '.join(f'{x:.3f}' for x in r['shares_fedsel'])}, FLGo "
                    f"{' '.join(f'{x:.3f}' for x in r['shares_flgo'])}; distinct picks per round fedsel "
                    f"{r['per_round_fedsel']:.2f}, FLGo {r['per_round_flgo']:.2f} ({r['z_picks']:.1f} s.e.), their histogram TV "
                    f"{r['tv_picks_fedsel']:.3f}, FLGo {r['tv_picks_reference']:.3f} (ratio {ratio_p:.2f})"
                )
                if a.C > 0:
                    line += (
                        f"; mean credits fastest first fedsel {' '.join(f'{x:.1f}' for x in r['credits_fedsel'])}, "
                        f"FLGo {' '.join(f'{x:.1f}' for x in r['credits_flgo'])}"
                    )
                if given == DEPARTURES:
                    m = r["mismatch"]
                    if a.C == 0:
                        line += (
                            f"; lockstep over {a.seeds} seeds: tiers differ {m['tiers']}, credits differ "
                            f"{m['credit']} rounds, probabilities differ {m['prob']} rounds (max {m['max_prob_diff']:.1e}), "
                            f"draws FLGo could not make {m['draw']}, rounds with a pool under K {m['count']}"
                        )
                    failed |= max(ratio, ratio_s) > a.ratio or r["z_picks"] > a.z
                    failed |= any(m[x] for x in ("tiers", "credit", "prob", "draw"))
                print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
