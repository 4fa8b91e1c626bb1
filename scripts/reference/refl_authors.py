#!/usr/bin/env python3
"""fedsel's REFL (IPS) beside the authors' own, fed the same availability trace.

The reference is github.com/ahmedcs/REFL at commit aa7e6425fe8b888bccfcc722a086df120cbd833e:
`core/client_manager.py` (`clientManager.resampleClients`, `getPriority`, `isAvailable`,
`getFeasibleClients`) over their `core/helper/client.py` (`Client.isActive`,
`availabilityPeriods`), both imported from `--checkout` at run time, and the
`prohibit_reselect` step of `core/aggregator.py`'s `round_completion_handler` (lines
682-729: the `if self.args.stale_update != 0 or self.args.prohibit_reselect != 0:` block,
the `list(set(...))` after it and the `last_run_round` loop), which the driver finds with
`ast` and executes unchanged on a stand-in aggregator (`args`, `epoch`, `staleWeights`,
`last_run_round`, `client_manager`, `rng`): `aggregator.py` itself imports torch and is
never imported. Nothing of their code is copied here.

The federation: N clients, each a two-state Markov chain on/off per round (P(on -> on) = a_k,
P(off -> on) = b_k, the first round drawn from its stationary law), drawn per federation
with a different persistence: 1 `persistent` (a ~ U(0.85, 0.99)), 2 `mixed`
(a ~ U(0.2, 0.95)), 3 `fleeting` (a ~ U(0.1, 0.6)). The trace is fixed per federation and
is the same for every seed and both sides; only the selectors' seeds vary.
- The authors' side reads it as their behave trace: client k's online runs of rounds a..b-1
  are periods [aT, bT - 1] of `active`/`inactive` (T = 1000 s a round; a sentinel period
  after the horizon, so that no list is empty), registered with `random_behv = 0` (client k
  gets trace k); round t is `cur_time = tT` and the window (their moving-average deadline)
  T - 2, so that `isActive(tT)` is "on in round t" and `getPriority` is 1 exactly when the
  client is on in round t and off in round t + 1 (`isActive`'s bounds are inclusive, hence
  the tick). The driver checks both on every round of the first seed. Selection runs as
  their aggregator runs it with `avail_priority = 1`, `sample_mode = random`,
  `prohibit_reselect` = `--prohibit-reselect` (5, their default, `argParser.py:57`) and
  `avail_probability` = `--avail-probability` (0.9, their `run_exps.sh`'s value): `resampleClients(K, cur_time, window)`, sorted, every picked
  client completing (equal costs, no deadline, no dropouts: `tictak_client_tasks` then
  returns the sorted picks), then the aggregator's block above with no stale update
  pending. Their client manager's stream is `Random(233 + seed)` as they seed it; their
  aggregator's `Random()` is unseeded in their code and gets `Random(seed)` here.
- fedsel's side: `fedsel.Selector("refl", per_round=K, ..., prohibit_reselect=P)` with the
  same P, `select(t, available=<the
  trace's online clients in round t>, budget=K, query=None)` every round in order (its
  predictor counts the pairs of consecutive rounds it is shown), then `observe(picked)`;
  REFL learns nothing else from the feedback.

fedsel departs from this code on purpose in three places (crates/fedsel/src/select/refl.rs,
module doc), and the comparison that judges fedsel gives the authors' code the same three,
so that what remains is what fedsel got wrong:
- `predictor`: the priority is p̂_k < 1/2, p̂_k = (s_k + 1)/(n_k + 2) from the observed
  availability of the past rounds (fedsel's estimate, recomputed here from the same trace
  and checked against fedsel's `state()`), in place of the trace oracle `isAvailable` and
  its `avail_probability` blur (then 0): a subclass's `getPriority`;
- `k`: the round runs K clients, not `min(K, len - 1)` of the shuffled list: the subclass
  takes the first min(K, len) of the list their `resampleClients` shuffled (read from their
  client manager's stream, which records the list it shuffles);
- `prohibit`: a client run within the last `prohibit_reselect` rounds is left out before the
  priority (the subclass's `getFeasibleClients` offers their `resampleClients` only the
  others when more than K are online), the round filled uniformly from the recent ones when
  too few others remain, in place of the aggregator's removal after the selection and its
  replacement by uniform draws among all online clients. The aggregator's block is then not
  run (the driver keeps `last_run_round`). As it is, that block also lets recent clients
  through: it removes from `clientsToRun` while iterating over it (a recent client right
  after a removed one stays), and a replacement is only kept from being the client it
  replaces, one already in the round or one with a stale update, so it may be a recent
  client or one removed just before.
The figures against their code as it is are printed too (`as is`, and as it is for each
departure alone): their distance is the effect of the departures.

What is random is compared by the selection frequencies over the seeds: the total-variation
distance between fedsel's (seeds 1..S) and the authors' (seeds 1..S), against the authors' own
seed-to-seed distance (seeds 1..S against S+1..2S). Printed besides: the share of the picks
that went to clients about to leave (on in round t, off in t + 1: the oracle's priority
clients), the share of the picks that were clients run within the last `prohibit_reselect`
rounds in rounds where at least K others were online (where fedsel never picks one), and
the rounds run with fewer than K clients while more than K were online. Exits 1 when fedsel's
distance to the authors' code with fedsel's departures exceeds `--ratio` times the authors'
own on any federation.

    git clone https://github.com/ahmedcs/REFL /tmp/REFL && git -C /tmp/REFL checkout aa7e6425fe8b888bccfcc722a086df120cbd833e
    python scripts/reference/refl_authors.py --checkout /tmp/REFL [--prohibit-reselect 5] [--seeds 30] [--rounds 100] [--per-round 10] [--clients 100] [--federations 1 2 3] [--avail-probability 0.9] [--json FILE]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import logging
import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from frequency import tv
from stand_ins import import_over

T = 1000  # seconds a round
WINDOW = T - 2  # their moving-average deadline: the round, less the ticks isActive's bounds need
PROHIBIT = 5  # prohibit_reselect's default: theirs (argParser.py:57) and fedsel's
DEPARTURES = frozenset({"predictor", "k", "prohibit"})
NAMED = {"predictor": "the trace oracle", "k": "min(K, len - 1)", "prohibit": "prohibit_reselect after the priority"}
PERSISTENCE = {1: ("persistent", (0.85, 0.99), (0.05, 0.3)), 2: ("mixed", (0.2, 0.95), (0.2, 0.6)), 3: ("fleeting", (0.1, 0.6), (0.3, 0.8))}


class Hang(RuntimeError):
    """The aggregator's replacement loop drew too long (it has no way out when every online
    client is excluded)."""


# ---------------------------------------------------------------------------------------
# The federation


@dataclass
class Federation:
    name: str
    on: np.ndarray  # (rounds + 1, N) bool: round t's availability; the last row is the oracle's look-ahead
    sizes: list[int]

    @staticmethod
    def build(fed: int, n: int, rounds: int) -> "Federation":
        name, (a_lo, a_hi), (b_lo, b_hi) = PERSISTENCE[(fed - 1) % 3 + 1]
        rng = np.random.default_rng(20_000 + fed)
        a = rng.uniform(a_lo, a_hi, n)
        b = rng.uniform(b_lo, b_hi, n)
        on = np.zeros((rounds + 1, n), dtype=bool)
        on[0] = rng.random(n) < b / (1 - a + b)
        for t in range(1, rounds + 1):
            u = rng.random(n)
            on[t] = np.where(on[t - 1], u < a, u < b)
        return Federation(name, on, [int(s) for s in rng.integers(50, 401, n)])

    def online(self, t: int) -> list[int]:
        return [int(k) for k in np.flatnonzero(self.on[t])]

    def leaving(self, t: int) -> set[int]:
        return {int(k) for k in np.flatnonzero(self.on[t] & ~self.on[t + 1])}

    def behave_trace(self, k: int) -> dict:
        """Client k's availability as their behave trace (`active`/`inactive` periods)."""
        rounds = self.on.shape[0]
        active, inactive, t = [], [], 0
        while t < rounds:
            if self.on[t, k]:
                start = t
                while t < rounds and self.on[t, k]:
                    t += 1
                active.append(start * T)
                inactive.append(t * T - 1)
            else:
                t += 1
        active.append((rounds + 2) * T)  # sentinel: after the horizon
        inactive.append((rounds + 3) * T - 1)
        return {"active": active, "inactive": inactive, "finish_time": (rounds + 10) * T,
                "duration": int(sum(e - s for s, e in zip(active, inactive))), "model": "trace"}


class Predictor:
    """fedsel's availability estimate (refl.rs): n_k pairs of consecutive observed rounds with
    k available in the first, s_k of them with k available in both; p̂_k = (s_k+1)/(n_k+2)."""

    def __init__(self, n: int):
        self.last_round, self.last = None, np.zeros(n, dtype=bool)
        self.seen, self.stayed = np.zeros(n, dtype=int), np.zeros(n, dtype=int)

    def observe(self, t: int, available) -> None:
        now = np.zeros_like(self.last)
        now[list(available)] = True
        if self.last_round is not None and self.last_round + 1 == t:
            self.seen += self.last
            self.stayed += self.last & now
        self.last_round, self.last = t, now

    def leaves(self, k: int) -> bool:
        return (self.stayed[k] + 1) / (self.seen[k] + 2) < 0.5


# ---------------------------------------------------------------------------------------
# The authors' code


def load_client_manager(checkout: Path):
    """Their `core/client_manager.py`, importing their `core/helper/client.py`."""
    core = checkout / "core"
    spec = importlib.util.spec_from_file_location("helper.client", core / "helper" / "client.py")
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    helper = types.ModuleType("helper")
    helper.__path__ = []
    helper.client = client
    return import_over("refl_client_manager", core / "client_manager.py", {"helper": helper, "helper.client": client})


def prohibit_block(checkout: Path):
    """The statements of `round_completion_handler` from the `stale_update != 0 or
    prohibit_reselect != 0` block to the `last_run_round` loop, compiled unchanged."""
    path = checkout / "core" / "aggregator.py"
    tree = ast.parse(path.read_text(), str(path))
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "round_completion_handler"), None)
    if fn is None:
        raise SystemExit(f"{path}: no round_completion_handler")
    body = fn.body
    start = next((i for i, s in enumerate(body) if isinstance(s, ast.If)
                  and ast.unparse(s.test) == "self.args.stale_update != 0 or self.args.prohibit_reselect != 0"), None)
    end = next((i for i, s in enumerate(body) if start is not None and i > start and isinstance(s, ast.For)
                and ast.unparse(s.iter) == "clientsToRun" and "self.last_run_round[c] = self.epoch" in ast.unparse(s)), None)
    if start is None or end is None:
        raise SystemExit(f"{path}: the prohibit_reselect block or the last_run_round loop is not where expected")
    between = [ast.unparse(s) for s in body[start + 1 : end]]
    if between != ["clientsToRun = list(set(clientsToRun))"]:
        raise SystemExit(f"{path}: unexpected statements between the block and the loop: {between}")
    return compile(ast.Module(body=body[start : end + 1], type_ignores=[]), f"{path}:{body[start].lineno}", "exec")


class Recording(random.Random):
    """Their client manager's stream (same draws as `random.Random`), remembering the list it
    last shuffled: `resampleClients` shuffles its selection list once and slices it."""

    shuffled = None

    def shuffle(self, x):
        super().shuffle(x)
        self.shuffled = x


class Counting(random.Random):
    """Their aggregator's stream, raising `Hang` after `limit` draws in one round."""

    limit, calls = 100_000, 0

    def randint(self, a, b):
        self.calls += 1
        if self.calls > self.limit:
            raise Hang
        return super().randint(a, b)


def manager_class(cm_module, departures):
    """Their `clientManager` with those of fedsel's departures in `departures` applied."""
    base = cm_module.clientManager

    class Manager(base):
        def getFeasibleClients(self, cur_time):
            online = base.getFeasibleClients(self, cur_time)
            self.online_now = online
            self.predictor.observe(self.round, online)
            self.offered = online
            if "prohibit" in departures and len(online) > self.K:
                self.offered = [c for c in online if c not in self.recent]
            return self.offered

        def getPriority(self, clientId, cur_time, time_window, lookup_timeslots=2):
            if "predictor" in departures:
                return int(self.predictor.leaves(clientId))
            return base.getPriority(self, clientId, cur_time, time_window, lookup_timeslots)

        def resampleClients(self, numOfClients, cur_time=0, time_window=0):
            self.rng.shuffled = None
            picked, priority = base.resampleClients(self, numOfClients, cur_time, time_window)
            if "k" in departures and self.rng.shuffled is not None:
                picked = self.rng.shuffled[: min(numOfClients, len(self.rng.shuffled))]
            return picked, priority

    return Manager


@dataclass
class Tally:
    counts: np.ndarray
    prohibit: int = PROHIBIT
    picks: int = 0
    leaving: int = 0
    recent: int = 0
    short: int = 0
    hangs: int = 0

    def add(self, fed: Federation, t: int, picked, last_run: dict, k: int) -> None:
        online = fed.online(t)
        for c in picked:
            self.counts[c] += 1
        self.picks += len(picked)
        self.leaving += len(fed.leaving(t) & set(picked))
        recent = {c for c in online if last_run.get(c) is not None and t - last_run[c] < self.prohibit}
        if len(online) - len(recent) >= k:
            self.recent += len(recent & set(picked))
        self.short += len(online) > k and len(picked) < k
        for c in picked:
            last_run[c] = t

    def merge(self, other: "Tally") -> None:
        self.counts += other.counts
        for f in ("picks", "leaving", "recent", "short", "hangs"):
            setattr(self, f, getattr(self, f) + getattr(other, f))


def run_authors(cm_module, block, fed: Federation, seed: int, k: int, avail_probability: float, departures,
                prohibit: int = PROHIBIT, check=False) -> Tally:
    n = fed.on.shape[1]
    rounds = fed.on.shape[0] - 1
    args = SimpleNamespace(
        filter_less=0, filter_more=10**12, used_samples=-1, sample_seed=seed, device_avail_file=None,
        random_behv=0, avail_priority=1, prohibit_reselect=prohibit, stale_update=-1,
        avail_probability=0.0 if "predictor" in departures else avail_probability,
    )
    cm = manager_class(cm_module, departures)("random", args)
    cm.rng = Recording(233 + seed)
    cm.user_trace = {c: fed.behave_trace(c) for c in range(n)}
    cm.K, cm.recent, cm.predictor, cm.round = k, set(), Predictor(n), 0
    for c in range(n):
        cm.registerClient(0, c, fed.sizes[c], {"computation": 1.0, "communication": 1.0})
        cm.clients_exe_cost[str(c)] = (1.0, 1.0)
    agg = SimpleNamespace(args=args, epoch=0, staleWeights={}, last_run_round={c: 0 for c in range(n)},
                          client_manager=cm, rng=Counting(seed), total_worker=k, sampled_participants=[])
    fill = random.Random(10**6 + seed)
    tally, last_run = Tally(np.zeros(n), prohibit), {}
    for t in range(rounds):
        agg.epoch = t + 1  # their advance_round comes first: the first selection is epoch 1
        cm.round = t
        cm.recent = {c for c in range(n) if agg.last_run_round[c] != 0 and agg.epoch - agg.last_run_round[c] < prohibit}
        picked, priority = cm.resampleClients(k, cur_time=t * T, time_window=WINDOW)
        picked = sorted(picked)
        if check:
            assert cm.online_now == fed.online(t), f"round {t}: their online list is not the trace's"
            if "predictor" not in departures:
                # The oracle's priority clients: those offered that leave after this round
                # (none when at most K are offered: all of them run).
                due = fed.leaving(t) & set(cm.offered) if len(cm.offered) > k else set()
                assert set(priority) <= due, f"round {t}: their priority clients are not the leaving ones"
                if avail_probability == 0:
                    assert set(priority) == due, f"round {t}: the leaving ones are not all their priority clients"
        if "prohibit" in departures:
            online = cm.online_now
            fresh = [c for c in online if c not in cm.recent]
            if len(online) > k and len(fresh) < k:
                picked += fill.sample(sorted(set(online) - set(fresh)), k - len(fresh))
            for c in picked:
                agg.last_run_round[c] = agg.epoch
            clients = picked
        else:
            agg.sampled_participants = picked
            agg.staleWeights = {}
            agg.rng.calls = 0
            ns = {"self": agg, "clientsToRun": list(picked), "virtual_client_clock": {}, "round_stragglers": [], "logging": logging}
            try:
                exec(block, ns)
                clients = ns["clientsToRun"]
            except Hang:
                tally.hangs += 1
                clients = [c for c in picked if c not in cm.recent]
                for c in clients:
                    agg.last_run_round[c] = agg.epoch
        tally.add(fed, t, clients, last_run, k)
    return tally


# ---------------------------------------------------------------------------------------
# fedsel


def run_fedsel(fed: Federation, seed: int, k: int, prohibit: int = PROHIBIT, check=False) -> Tally:
    import fedsel

    n = fed.on.shape[1]
    rounds = fed.on.shape[0] - 1
    sel = fedsel.Selector("refl", sizes=fed.sizes, per_round=k, rounds=rounds, seed=seed, prohibit_reselect=prohibit)
    tally, last_run, pred = Tally(np.zeros(n), prohibit), {}, Predictor(n)
    for t in range(rounds):
        online = fed.online(t)
        picked = [int(c) for c in sel.select(t, available=online, budget=k, query=None)]
        sel.observe(picked)
        tally.add(fed, t, picked, last_run, k)
        pred.observe(t, online)
    if check:
        state = sel.state()["selector"]
        if list(state["seen"]) != pred.seen.tolist() or list(state["stayed"]) != pred.stayed.tolist():
            raise AssertionError("the driver's predictor counts differ from fedsel's state()")
    return tally


def compare(cm_module, block, fed: Federation, seeds: int, k: int, avail_probability: float, departures, ours: Tally,
            prohibit: int = PROHIBIT) -> dict:
    n = fed.on.shape[1]
    ref, other = Tally(np.zeros(n), prohibit), Tally(np.zeros(n), prohibit)
    for s in range(1, seeds + 1):
        ref.merge(run_authors(cm_module, block, fed, s, k, avail_probability, departures, prohibit, check=s == 1))
        other.merge(run_authors(cm_module, block, fed, seeds + s, k, avail_probability, departures, prohibit))
    return {"tv_fedsel": tv(ours.counts, ref.counts), "tv_reference": tv(other.counts, ref.counts), "ref": ref}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help="a checkout of ahmedcs/REFL at aa7e642")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--federations", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--prohibit-reselect", type=int, default=PROHIBIT,
                   help="rounds a run client sits out, both sides (their default and fedsel's: 5)")
    p.add_argument("--avail-probability", type=float, default=0.9, help="their oracle's accuracy in the `as is` runs (run_exps.sh: 0.9)")
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--json", type=Path, help="also write the figures and the selection frequencies")
    a = p.parse_args(argv)
    if a.prohibit_reselect < 0:
        p.error("--prohibit-reselect must be at least 0")
    cm_module = load_client_manager(a.checkout)
    block = prohibit_block(a.checkout)
    worst, out = 0.0, []
    for f in a.federations:
        fed = Federation.build(f, a.clients, a.rounds)
        ours = Tally(np.zeros(a.clients), a.prohibit_reselect)
        for s in range(1, a.seeds + 1):
            ours.merge(run_fedsel(fed, s, a.per_round, a.prohibit_reselect, check=s == 1))
        online = fed.on[:-1].sum(1)
        base = np.mean([len(fed.leaving(t)) / max(1, len(fed.online(t))) for t in range(a.rounds)])
        print(f"federation {f} ({fed.name}), prohibit_reselect {a.prohibit_reselect}: {online.mean():.1f} online a round ({online.min()}-{online.max()}), "
              f"{base:.1%} of them leaving; fedsel: leaving {ours.leaving / ours.picks:.1%} of picks, recent "
              f"{ours.recent / ours.picks:.2%}, short rounds {ours.short / a.seeds:.1f} per run")
        cases = [("with fedsel's departures", DEPARTURES)]
        cases += [(f"as is for {NAMED[d]}", DEPARTURES - {d}) for d in sorted(DEPARTURES)]
        cases += [("as is", frozenset())]
        for label, given in cases:
            r = compare(cm_module, block, fed, a.seeds, a.per_round, a.avail_probability, given, ours, a.prohibit_reselect)
            ref = r["ref"]
            ratio = r["tv_fedsel"] / r["tv_reference"]
            if given == DEPARTURES:
                worst = max(worst, ratio)
            print(f"  authors {label}: TV(fedsel, authors) {r['tv_fedsel']:.3f}, authors seed to seed "
                  f"{r['tv_reference']:.3f} (ratio {ratio:.2f}); leaving share fedsel {ours.leaving / ours.picks:.1%}, "
                  f"authors {ref.leaving / ref.picks:.1%}; authors recent {ref.recent / ref.picks:.2%}, short rounds "
                  f"{ref.short / a.seeds:.1f} per run, picks a round {ref.picks / a.seeds / a.rounds:.2f}"
                  + (f", replacement hangs {ref.hangs}" if ref.hangs else ""))
            out.append({"federation": f, "name": fed.name, "prohibit_reselect": a.prohibit_reselect, "case": label, "departures": sorted(given),
                        "tv_fedsel": r["tv_fedsel"], "tv_reference": r["tv_reference"], "ratio": ratio,
                        "leaving_fedsel": ours.leaving / ours.picks, "leaving_authors": ref.leaving / ref.picks,
                        "recent_authors": ref.recent / ref.picks, "short_authors": ref.short / a.seeds,
                        "freq_fedsel": (ours.counts / ours.counts.sum()).tolist(),
                        "freq_authors": (ref.counts / ref.counts.sum()).tolist()})
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    print(f"worst ratio with fedsel's departures {worst:.2f} (limit {a.ratio})")
    return 0 if worst <= a.ratio else 1


if __name__ == "__main__":
    sys.exit(main())
