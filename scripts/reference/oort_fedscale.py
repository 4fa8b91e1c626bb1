#!/usr/bin/env python3
"""fedsel's Oort beside FedScale's own, fed the same federation and the same feedback.

The reference is the training selector of `thirdparty/oort/oort.py` in FedScale 1.0 (the
`fedscale` wheel on PyPI), downloaded into a temporary directory at run time: its code is
never part of this repository. Both selectors see the same clients (sizes, each device's
round trip at registration, all of them available), and each round every selected client
reports the same things to both: its statistical utility n_k·|loss| (the loss falls with
the client's participations), its round trip, and whether the server kept its update.

FedScale is driven as its aggregator drives it (fedscale/cloud/aggregation/aggregator.py and
client_manager.py): `register_client` with reward min(n_k, steps·batch) (here n_k: steps·batch
is at least the largest size) and the device's duration; the first round picked uniformly
by the client manager; then `select_participant` each round, and `update_client_util` with
(reward, duration, time stamp = the aggregator's round) for each client that reported. With
`--overcommit o` the server selects ceil((1 + o)·K) and keeps the K fastest, and a dropped
straggler is registered as FedScale's `round_completion_handler` does: the round's mean
utility and its exact duration. fedsel hears `dropped=` with the round's cut instead.

fedsel departs from this code on purpose in four places (the module doc of
crates/fedsel/src/select/oort.rs says why), and the comparison that judges fedsel gives
FedScale the same four, so that what remains is what fedsel got wrong:
- FedScale's client manager picks the first round uniformly at random (its `getTopK` cannot
  rank with nothing explored); fedsel explores it by exploration's prior, and the reference
  here does the same on its own state (`explore_first`);
- once no client is left unexplored, FedScale's `getTopK` returns its previous round's
  exploration list again every round (it resets it only while something is left to
  explore): the reference here explores nobody then;
- when fewer clients are left unexplored than exploration's share, FedScale returns fewer
  than the budget; fedsel's exploitation takes the slots, and so does the reference here
  (its exploration share is lowered to what is left for that call);
- with over-commitment, a dropped straggler is registered as a trial with the round's mean
  utility, as FedScale does, but its known duration only rises to the round's cut (a server
  that stopped waiting cannot know the exact one), stamped with the round it was tried in.
The figures against FedScale as it is are printed too (`as is`, and as it is for each
departure alone): their distance is the effect of the departures.

What is random is compared by the selection frequencies over the seeds: the total-variation
distance between fedsel's and FedScale's, against FedScale's own seed-to-seed distance
(seeds 1..S against S+1..2S). Prints one line per federation and exits 1 when fedsel's
distance to FedScale with fedsel's departures exceeds `--ratio` times FedScale's own on any.

    python scripts/reference/oort_fedscale.py [--seeds 30] [--rounds 120] [--overcommit 0.3] [--no-registration]
"""

from __future__ import annotations

import argparse
import builtins
import importlib
import math
import random
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from frequency import tv
from wheels import Unavailable, download_wheel

WHEEL = "fedscale==1.0"



def load_fedscale_oort(into: Path):
    """Downloads the FedScale 1.0 wheel into `into` and imports its Oort module."""
    wheel = download_wheel(WHEEL, into, "fedscale-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into / "pkg", [n for n in z.namelist() if n.startswith("thirdparty/oort/")])
    (into / "pkg" / "thirdparty" / "__init__.py").touch()
    sys.path.insert(0, str(into / "pkg"))
    module = importlib.import_module("thirdparty.oort.oort")
    # `from numpy import *` (through utils/lp.py) shadows builtins such as min and max
    # under numpy 2; the selector means Python's.
    for name in ("min", "max", "abs", "round", "sum", "all", "any"):
        if name in vars(module):
            setattr(module, name, getattr(builtins, name))
    return module


@dataclass
class Federation:
    sizes: list[int]
    durations: list[float]
    base_loss: list[float]

    @staticmethod
    def build(seed: int, n: int = 100) -> "Federation":
        """n clients with sizes in 50..400 and log-normal round trips (median 50 s, σ 0.8)."""
        rng = np.random.default_rng(10_000 + seed)
        return Federation(
            sizes=[int(s) for s in rng.integers(50, 401, n)],
            durations=[float(d) for d in np.exp(rng.normal(math.log(50.0), 0.8, n))],
            base_loss=[float(b) for b in rng.uniform(0.5, 2.5, n)],
        )

    def loss(self, k: int, trained: int) -> float:
        """Client k's mean training loss after `trained` participations."""
        return self.base_loss[k] * 0.9**trained


def fedscale_args(steps_batch: int) -> SimpleNamespace:
    """FedScale's defaults (fedscale/cloud/config_parser.py), fedsel's `[selection.oort]`."""
    return SimpleNamespace(
        exploration_factor=0.9, exploration_decay=0.98, exploration_min=0.3, exploration_alpha=0.3,
        round_threshold=30.0, round_penalty=2.0, clip_bound=0.9, blacklist_rounds=-1,
        blacklist_max_len=0.3, cut_off_util=0.05, pacer_delta=5.0, pacer_step=20,
        sample_window=5.0, local_steps=steps_batch, batch_size=1,
    )


# fedsel's deliberate departures from FedScale, each of which the reference can be given:
# "first": the first round explored by exploration's prior, not uniformly; "stale": no
# stale exploration list once nobody is left to explore; "fill": exploitation takes the
# slots exploration cannot fill; "stragglers": a dropped straggler is registered as a trial
# with the round's mean utility, its duration the larger of the known one and the round's
# cut (not the exact one), stamped with the round it was tried in.
DEPARTURES = frozenset({"first", "stale", "fill", "stragglers"})


def with_fedsel_departures(oort, departures=DEPARTURES):
    """FedScale's training selector with fedsel's departures in `getTopK` applied (those of
    `departures` among "stale" and "fill")."""
    base = oort._training_selector

    class Selector(base):
        def getTopK(self, numOfSamples, cur_time, feasible_clients):
            if "stale" in departures:
                # FedScale keeps the last exploration list while nothing is left to explore.
                self.exploreClients = []
            fresh = sum(1 for c in self.unexplored if c in feasible_clients)
            decayed = max(self.exploration * self.decay_factor, self.exploration_min)
            if "fill" not in departures or fresh >= int(numOfSamples * decayed):
                return base.getTopK(self, numOfSamples, cur_time, feasible_clients)
            # Exploration's share for this call is what is left to explore, so that
            # exploitation's is the rest of the budget; the decay schedule is restored.
            floor = self.exploration_min
            self.exploration_min = 0.0
            self.exploration = (fresh + 0.5) / numOfSamples / self.decay_factor
            try:
                return base.getTopK(self, numOfSamples, cur_time, feasible_clients)
            finally:
                self.exploration, self.exploration_min = decayed, floor

    return Selector


def explore_first(sel, budget: int) -> list[int]:
    """fedsel's first round on FedScale's state: `getTopK`'s exploration step over every
    client (the prior reward·(T/t)^α above the preferred duration T, the sample_window·budget
    largest, sampled ∝ prior from NumPy's global stream, which FedScale's selector seeds)."""
    arms = sel.totalArms
    durations = sorted(a["duration"] for a in arms.values())
    t = math.inf
    if sel.round_threshold < 100.0:
        t = durations[min(int(len(durations) * sel.round_threshold / 100.0), len(durations) - 1)]
    prior = {}
    for c, a in arms.items():
        prior[c] = a["reward"]
        if a["duration"] > t:
            prior[c] *= (t / max(1e-4, a["duration"])) ** sel.args.round_penalty
    window = sorted(prior, key=prior.get, reverse=True)[: min(int(sel.sample_window * budget), len(prior))]
    total = max(1e-4, float(sum(prior[c] for c in window)))
    return [int(c) for c in np.random.choice(window, budget, p=[prior[c] / total for c in window], replace=False)]


def keep_fastest(fed: Federation, picked: list[int], k: int) -> tuple[list[int], list[int], float]:
    """Over-commitment: the k fastest are kept, the round closes when the last arrives."""
    order = sorted(picked, key=lambda c: fed.durations[c])
    kept, dropped = order[:k], order[k:]
    return kept, dropped, max((fed.durations[c] for c in kept), default=0.0)


def run_fedscale(oort, fed: Federation, seed: int, rounds: int, k: int, overcommit: float, departures=DEPARTURES):
    """Per-client selection counts and the rounds that returned fewer than the budget;
    `departures`: those of fedsel's deliberate departures the reference is given."""
    n = len(fed.sizes)
    cls = with_fedsel_departures(oort, departures)
    sel = cls(fedscale_args(max(fed.sizes)), sample_seed=seed)
    for c in range(n):
        sel.register_client(c, {"reward": min(fed.sizes[c], max(fed.sizes)), "duration": fed.durations[c]})
    budget = math.ceil((1 + overcommit) * k)
    counts, trained, short = np.zeros(n), [0] * n, 0
    first = random.Random(seed)
    for r in range(1, rounds + 1):
        if r == 1 and "first" in departures:
            picked = explore_first(sel, budget)
        elif r == 1:
            online = list(range(n))
            first.shuffle(online)
            picked = online[:budget]
        else:
            picked = [int(c) for c in sel.select_participant(budget, feasible_clients=set(range(n)))]
        distinct = list(dict.fromkeys(picked))
        short += len(distinct) < budget
        kept, dropped, cut = keep_fastest(fed, distinct, k) if overcommit else (distinct, [], 0.0)
        utils = []
        for c in distinct:
            counts[c] += 1
        for c in kept:
            u = fed.sizes[c] * abs(fed.loss(c, trained[c]))
            utils.append(u)
            trained[c] += 1
            sel.update_client_util(c, {"reward": u, "duration": fed.durations[c], "time_stamp": r, "status": True})
        mean = sum(utils) / max(1, len(utils))
        for c in dropped:
            if "stragglers" in departures:
                known = max(sel.totalArms[c]["duration"], cut)
                sel.update_client_util(c, {"reward": mean, "duration": known, "time_stamp": r, "status": True})
            else:
                sel.update_client_util(c, {"reward": mean, "duration": fed.durations[c], "time_stamp": r + 1, "status": True})
    return counts, short


def run_fedsel(fed: Federation, seed: int, rounds: int, k: int, overcommit: float, registration: bool):
    import fedsel

    n = len(fed.sizes)
    budget = math.ceil((1 + overcommit) * k)
    extra = {"durations": fed.durations} if registration else {}
    sel = fedsel.Selector("oort", sizes=fed.sizes, per_round=k, rounds=rounds, seed=seed, **extra)
    counts, trained = np.zeros(n), [0] * n
    for r in range(rounds):
        picked = [int(c) for c in sel.select(r, available=list(range(n)), budget=budget, query=None)]
        for c in picked:
            counts[c] += 1
        kept, dropped, cut = keep_fastest(fed, picked, k) if overcommit else (picked, [], 0.0)
        losses = [fed.loss(c, trained[c]) for c in kept]
        for c in kept:
            trained[c] += 1
        sel.observe(
            kept, train_losses=losses, durations=[fed.durations[c] for c in kept],
            **({"dropped": dropped, "dropped_durations": [cut] * len(dropped)} if dropped else {}),
        )
    return counts


def slow_share(fed: Federation, counts: np.ndarray) -> float:
    """The share of the picks that went to the slowest fifth of the clients."""
    slow = np.argsort(fed.durations)[-len(fed.durations) // 5 :]
    return float(counts[slow].sum() / counts.sum())


def compare(oort, fed_seed: int, seeds: int, rounds: int, k: int, overcommit: float, registration: bool, departures=DEPARTURES) -> dict:
    """fedsel against FedScale on federation `fed_seed`; `departures`: those of fedsel's
    deliberate departures FedScale is given (all of them: the fair comparison; none: FedScale
    as it is)."""
    fed = Federation.build(fed_seed)
    ref, other, ours, short = np.zeros(len(fed.sizes)), np.zeros(len(fed.sizes)), np.zeros(len(fed.sizes)), 0
    for s in range(1, seeds + 1):
        c, sh = run_fedscale(oort, fed, s, rounds, k, overcommit, departures)
        ref += c
        short += sh
        other += run_fedscale(oort, fed, seeds + s, rounds, k, overcommit, departures)[0]
        ours += run_fedsel(fed, s, rounds, k, overcommit, registration)
    return {
        "federation": fed_seed,
        "tv_fedsel": tv(ours, ref),
        "tv_reference": tv(other, ref),
        "slow_fedsel": slow_share(fed, ours),
        "slow_fedscale": slow_share(fed, ref),
        "short_rounds": short / seeds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--rounds", type=int, default=120)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--federations", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--overcommit", type=float, default=0.0)
    p.add_argument("--no-registration", action="store_true", help="fedsel without the registered durations")
    p.add_argument("--ratio", type=float, default=1.5)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            oort = load_fedscale_oort(Path(tmp))
        except Unavailable as e:
            print(f"skipped: {e}")
            return 0
        worst = 0.0
        named = {"first": "the uniform first round", "stale": "stale exploration list", "fill": "fewer than the budget", "stragglers": "stragglers' exact durations"}
        relevant = DEPARTURES if a.overcommit else DEPARTURES - {"stragglers"}
        for f in a.federations:
            # The fair comparison, then FedScale as it is for one departure at a time, then
            # for all of them.
            cases = [("with fedsel's departures", DEPARTURES)]
            cases += [(f"as is for {named[d]}", DEPARTURES - {d}) for d in sorted(relevant)]
            cases += [("as is", frozenset())]
            for label, given in cases:
                r = compare(oort, f, a.seeds, a.rounds, a.per_round, a.overcommit, not a.no_registration, given)
                ratio = r["tv_fedsel"] / r["tv_reference"]
                if given == DEPARTURES:
                    worst = max(worst, ratio)
                print(
                    f"federation {f}, FedScale {label}: TV(fedsel, FedScale) {r['tv_fedsel']:.3f}, FedScale "
                    f"seed to seed {r['tv_reference']:.3f} (ratio {ratio:.2f}); slowest fifth's share fedsel "
                    f"{r['slow_fedsel']:.1%}, FedScale {r['slow_fedscale']:.1%}; FedScale rounds short of the "
                    f"budget {r['short_rounds']:.1f} per run"
                )
    return 0 if worst <= a.ratio else 1


if __name__ == "__main__":
    sys.exit(main())
