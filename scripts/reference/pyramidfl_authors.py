#!/usr/bin/env python3
"""fedsel's PyramidFL (`protocol="code"`) beside liecn/PyramidFL's own selection, fed the
same federation and the same feedback.

The reference is liecn/PyramidFL at commit dd1d143 (fetch it yourself, pass the checkout
with `--checkout`): its `oort/oort.py` (PyramidFL's copy of Oort's training selector),
`training/helper/clientSampler.py` (the client sampler and its `Client` with
`getCompletionTime`, `training/helper/client.py`) and `training/param_server.py`'s
`prune_client_tasks`, each imported
and run unchanged. `param_server.py` imports its training stack at the top
(`fl_aggregator_libs`, torch, scipy); those are stand-ins here (`stand_ins.py`): an `args`
namespace of the code's `argParser.py` defaults, a torch with no CUDA device, an inert
`initiate_aggregator_setting`. `oort.py`'s `from utils import *` gets an empty module (the
LP solvers it would bring are for the testing selector), and `clientSampler.py`'s
`from oort import create_training_selector` the imported `oort.py`.

The server loop of `param_server.py` (`run`) is driven as it runs PyramidFL, for what the
selection reads: each round (epoch e = t + 2, the code's numbering after its warm-up epoch)
`resampleClients(int(K · overcommit))` sorted, `prune_client_tasks`, then for each client it
ran the learner's step count (`int(upload_epoch · ratio)` of the float32 ratio, capped at
max(5·⌊n/B⌋, upload_epoch)) and `registerScore` with the statistical utility
√(iteration_loss)·min(n, trained samples), the gradient utility √(‖Δ‖²)·min(n, trained)/100
and the registered round trip; then each pruned client with the round's mean utilities
(`is_even_avg`). The federation: N clients of 50-400 examples (all pass the code's
`filter_less = 32`), each with a computation speed and a bandwidth giving log-normal compute
(median 20 s) and transfer (median 10 s) times at the code's batch 30 and 10 local steps;
fedsel's `devices` carry the same times (the transfer split evenly into download and
upload). Each client's loss after j trainings is b_k·0.9^j (the code's `iteration_loss` is
its square, a mean squared loss) and its update's norm g_k·0.9^j (the code's norm is taken
with the broadcast model at 0: its ‖Δ − w‖ is fedsel's ‖Δ‖ there).

Where the driver seeds what the code does not: the code seeds Oort's NumPy global stream
and its `Random` with 233 in every run (`_training_selector(args, sample_seed=233)`), so its
runs would not differ; here both are seeded with the run's seed after construction, and the
client sampler gets it as `sample_seed`.

fedsel departs from this code in one place the comparison gives the reference too (the
module doc of crates/fedsel/src/select/pyramidfl.rs says why): the code's warm-up epoch,
one client per learner process (clients 1-4 under `--learners 1-2-3-4`, registered with the
placeholder duration 1 s) before its first sampled round. `--warmup` runs the code with it:
its distance is that departure's effect.

Compared: the selection frequencies of the trained clients over seeds 1..S, as the
total-variation distance between fedsel's and the code's, against the code's own
seed-to-seed one (seeds 1..S against S+1..2S), and the fastest fifth's share of the trained
picks. Exits 1 when fedsel's distance exceeds `--ratio` times the code's own. `--lockstep`
instead hands the code fedsel's selection each round (no over-commitment, so nothing is
pruned and both hold the same state) and compares the ordered step counts and dropout
ratios entry by entry.

    python scripts/reference/pyramidfl_authors.py --checkout /tmp/PyramidFL [--seeds 20] [--rounds 300] [--lockstep] [--warmup]
"""

from __future__ import annotations

import argparse
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from frequency import tv
from stand_ins import import_over

COMMIT = "dd1d143"
BATCH, STEPS, MODEL = 30, 10, 65536.0


class Unavailable(RuntimeError):
    """The checkout is missing or lacks a file the driver imports."""


def authors_args(k: int, overcommit: float) -> SimpleNamespace:
    """`training/argParser.py`'s defaults that the selection reads, with both of PyramidFL's
    mechanisms on, as every `conf_ours.yml` runs it."""
    return SimpleNamespace(
        exploration_factor=0.9, exploration_decay=0.95, exploration_min=0.2, exploration_alpha=0.3,
        round_threshold=10.0, round_penalty=2.0, clip_bound=0.98, blacklist_rounds=-1,
        blacklist_max_len=0.3, cut_off_util=0.7, pacer_delta=5.0, pacer_step=20, sample_window=5.0,
        filter_less=32, filter_more=1e5, user_trace=None, batch_size=BATCH, upload_epoch=STEPS,
        model_size=MODEL, clock_factor=1.0, total_worker=k, overcommit=overcommit,
        enable_dropout=True, enable_adapt_local_epoch=True, dropout_low=0.1, dropout_high=0.6,
        adaptive_epoch_beta=1.0, enable_obs_local_epoch=False, ps_ip="127.0.0.1", ps_port="29501",
    )


@dataclass
class Authors:
    """The imported files: `sampler` (clientSampler.py), `server` (param_server.py)."""

    sampler: types.ModuleType
    server: types.ModuleType


def load_authors(checkout: Path, args: SimpleNamespace) -> Authors:
    """Imports the authors' selection files from `checkout` over stand-ins."""
    files = [checkout / "oort" / "oort.py", checkout / "training" / "helper" / "clientSampler.py",
             checkout / "training" / "param_server.py", checkout / "training" / "helper" / "client.py"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise Unavailable(f"not a liecn/PyramidFL checkout ({COMMIT}): missing {', '.join(missing)}")
    oort = import_over("pyramidfl_oort", files[0], {"utils": types.ModuleType("utils")})
    package = types.ModuleType("oort")
    package.create_training_selector = oort.create_training_selector
    helper = types.ModuleType("helper")
    helper.client = import_over("helper.client", files[3], {})
    sampler = import_over("pyramidfl_client_sampler", files[1],
                          {"oort": package, "helper": helper, "helper.client": helper.client})
    torch = types.ModuleType("torch")
    torch.cuda = SimpleNamespace(device_count=lambda: 0)
    libs = types.ModuleType("fl_aggregator_libs")
    import logging
    import os
    for name, value in {"args": args, "initiate_aggregator_setting": lambda: None, "torch": torch,
                        "os": os, "math": math, "logging": logging}.items():
        setattr(libs, name, value)
    scipy = types.ModuleType("scipy")
    scipy.io = types.ModuleType("scipy.io")
    server = import_over("pyramidfl_param_server", files[2],
                         {"fl_aggregator_libs": libs, "scipy": scipy, "scipy.io": scipy.io})
    return Authors(sampler, server)


@dataclass
class Federation:
    sizes: list[int]
    local_s: list[float]
    comm_s: list[float]
    base_loss: list[float]
    base_norm: list[float]

    @staticmethod
    def build(seed: int, n: int) -> "Federation":
        rng = np.random.default_rng(20_000 + seed)
        return Federation(
            sizes=[int(s) for s in rng.integers(50, 401, n)],
            local_s=[float(x) for x in np.exp(rng.normal(math.log(20.0), 0.8, n))],
            comm_s=[float(x) for x in np.exp(rng.normal(math.log(10.0), 0.8, n))],
            base_loss=[float(b) for b in rng.uniform(0.5, 2.5, n)],
            base_norm=[float(b) for b in rng.uniform(0.5, 2.0, n)],
        )

    def speed(self, k: int) -> dict:
        """The code's system profile giving client k's times at batch 30, 10 steps."""
        return {"computation": 3.0 * BATCH * STEPS / self.local_s[k], "communication": MODEL / self.comm_s[k]}

    def loss(self, k: int, trained: int) -> float:
        return self.base_loss[k] * 0.9**trained

    def norm(self, k: int, trained: int) -> float:
        return self.base_norm[k] * 0.9**trained

    def fastest_fifth(self) -> np.ndarray:
        trips = np.array(self.local_s) + np.array(self.comm_s)
        return np.argsort(trips)[: len(trips) // 5]


def authors_steps(size: int, ratio: float) -> int:
    """`run_client`'s steps: int(upload_epoch · ratio) of the float32 broadcast, capped at
    max(5·len(loader), upload_epoch), the loader of ⌊n/B⌋ full batches."""
    return min(int(STEPS * float(np.float32(ratio))), max(5 * (size // BATCH), STEPS))


def sampler_for(authors: Authors, fed: Federation, args: SimpleNamespace, seed: int):
    """The code's client sampler with every client registered (ids 1..N), its Oort's streams
    seeded with `seed` (see the module doc)."""
    args.sample_seed = seed
    cs = authors.sampler.clientSampler("oort", "loss", args=args, filter=args.filter_less, sample_seed=seed)
    for k, size in enumerate(fed.sizes):
        cs.registerClient(0, k + 1, 1.0, size, speed=fed.speed(k))
        cs.registerDuration(k + 1, batch_size=BATCH, upload_epoch=STEPS, model_size=MODEL)
    cs.ucbSampler.rng.seed(seed)
    np.random.seed(seed)
    return cs


def register(cs, fed: Federation, ran: list[int], steps: dict[int, int], trained: list[int],
             epoch: int, clock: dict[int, float], pruned: list[int]) -> None:
    """`run`'s registration (param_server.py lines 303-362, 437-442) for clients `ran`
    (ids 1..N) that trained `steps[c]` steps, then the `pruned` with the means."""
    util, grad = 0.0, 0.0
    for c in ran:
        k = c - 1
        loss, norm = fed.loss(k, trained[k]), fed.norm(k, trained[k])
        trained[k] += 1
        bin_ = min(fed.sizes[k], steps[c] * BATCH)
        u = math.sqrt(loss**2) * bin_
        g = math.sqrt(norm**2) * bin_ / 100
        cs.registerScore(c, u, g, auxi=loss, time_stamp=epoch, duration=clock.get(c, 1.0))
        util += u / len(ran)
        grad += g / len(ran)
    for c in pruned:
        cs.registerScore(c, util, grad, time_stamp=epoch, duration=clock[c], success=False)


def run_authors(authors: Authors, fed: Federation, seed: int, rounds: int, k: int, warmup: bool) -> np.ndarray:
    args = authors_args(k, 1.3)
    authors.server.args = args
    cs = sampler_for(authors, fed, args, seed)
    n = len(fed.sizes)
    counts, trained = np.zeros(n), [0] * n
    if warmup:
        # Epoch 1: one client per learner (`nextClientIdToRun`: clients 1-4), their own work,
        # registered with the placeholder duration of an empty `virtualClientClock`.
        first = [cs.nextClientIdToRun(hostId=w) for w in (1, 2, 3, 4)]
        register(cs, fed, first, {c: STEPS for c in first}, trained, 1, {}, [])
    for t in range(rounds):
        epoch = t + 2
        sampled = sorted(cs.resampleClients(int(args.total_worker * args.overcommit), cur_time=epoch))
        run, pruned, clock, _, ratios, _ = authors.server.prune_client_tasks(cs, sampled, k, 0.0)
        for c in run:
            counts[c - 1] += 1
        steps = {c: authors_steps(fed.sizes[c - 1], r) for c, r in zip(run, ratios)}
        register(cs, fed, run, steps, trained, epoch, clock, pruned)
    return counts


def devices(fed: Federation) -> list[dict]:
    return [
        dict(download_s=fed.comm_s[k] / 2, compute_s=fed.local_s[k], upload_s=fed.comm_s[k] / 2,
             steps=STEPS, epoch_steps=-(-size // BATCH), batch=BATCH)
        for k, size in enumerate(fed.sizes)
    ]


def run_fedsel(fed: Federation, seed: int, rounds: int, k: int, overcommit: float = 1.3, protocol: str = "code"):
    """Per-client trained counts, and each round's (chosen, orders)."""
    import fedsel

    n = len(fed.sizes)
    sel = fedsel.Selector("pyramidfl", sizes=fed.sizes, per_round=k, rounds=rounds, seed=seed,
                          devices=devices(fed), protocol=protocol, overcommit=overcommit)
    counts, trained, plans = np.zeros(n), [0] * n, []
    for t in range(rounds):
        chosen = [int(c) for c in sel.select(t, available=list(range(n)), budget=k, query=None)]
        plans.append((chosen, sel.orders))
        losses, updates = [], []
        for c in chosen:
            counts[c] += 1
            losses.append(fed.loss(c, trained[c]))
            updates.append([fed.norm(c, trained[c])])
            trained[c] += 1
        sel.observe(chosen, train_losses=losses, updates=updates)
    return counts, plans


def compare(authors: Authors, fed_seed: int, n: int, seeds: int, rounds: int, k: int, warmup: bool,
            protocol: str = "code") -> dict:
    fed = Federation.build(fed_seed, n)
    ref, other, ours = np.zeros(n), np.zeros(n), np.zeros(n)
    for s in range(1, seeds + 1):
        ref += run_authors(authors, fed, s, rounds, k, warmup)
        other += run_authors(authors, fed, seeds + s, rounds, k, warmup)
        ours += run_fedsel(fed, s, rounds, k, protocol=protocol)[0]
    fast = fed.fastest_fifth()
    return {
        "tv_fedsel": tv(ours, ref),
        "tv_reference": tv(other, ref),
        "fast_fedsel": float(ours[fast].sum() / ours.sum()),
        "fast_authors": float(ref[fast].sum() / ref.sum()),
    }


def lockstep(authors: Authors, fed_seed: int, n: int, seeds: int, rounds: int, k: int) -> dict:
    """fedsel runs free without over-commitment; each round the code's `prune_client_tasks`
    is handed fedsel's selection (its state registered from the same reports), and the
    ordered steps and dropout ratios are compared entry by entry."""
    fed = Federation.build(fed_seed, n)
    entries = steps_differ = dropout_differ = set_differ = 0
    one_more = 0
    for s in range(1, seeds + 1):
        args = authors_args(k, 1.0)
        authors.server.args = args
        cs = sampler_for(authors, fed, args, s)
        trained = [0] * n
        _, plans = run_fedsel(fed, s, rounds, k, overcommit=1.0)
        for t, (chosen, orders) in enumerate(plans):
            ids = sorted(c + 1 for c in chosen)
            run, pruned, clock, _, ratios, drops = authors.server.prune_client_tasks(cs, ids, k, 0.0)
            set_differ += sorted(run) != ids
            theirs = {c: (authors_steps(fed.sizes[c - 1], r), float(np.float32(d))) for c, r, d in zip(run, ratios, drops)}
            for c, (work, drop) in zip(chosen, orders):
                entries += 1
                want_steps, want_drop = theirs[c + 1]
                got = math.floor(STEPS * work)
                steps_differ += got != want_steps
                one_more += got == want_steps + 1
                dropout_differ += drop is None or abs(drop - want_drop) > 0.0
            register(cs, fed, run, {c: theirs[c][0] for c in run}, trained, t + 2, clock, pruned)
    return {"entries": entries, "steps_differ": steps_differ, "one_more": one_more,
            "dropout_differ": dropout_differ, "sets_differ": set_differ}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help=f"a liecn/PyramidFL checkout at {COMMIT}")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--per-round", type=int, default=20)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--federations", type=int, nargs="+", default=[1])
    p.add_argument("--warmup", action="store_true", help="run the code with its warm-up epoch")
    p.add_argument("--lockstep", action="store_true", help="compare step counts and dropouts entry by entry")
    p.add_argument("--protocol", default="code", help="fedsel's PyramidFL protocol (paper: its earlier reading)")
    p.add_argument("--ratio", type=float, default=1.5)
    a = p.parse_args(argv)
    try:
        authors = load_authors(a.checkout, authors_args(a.per_round, 1.3))
    except Unavailable as e:
        print(f"skipped: {e}")
        return 0
    worst = 0.0
    for f in a.federations:
        if a.lockstep:
            r = lockstep(authors, f, a.clients, a.seeds, a.rounds, a.per_round)
            print(f"federation {f}, lockstep: {r['entries']} entries, steps differ in {r['steps_differ']} "
                  f"(fedsel one more in {r['one_more']}), dropout ratios differ in {r['dropout_differ']}, "
                  f"kept sets differ in {r['sets_differ']} rounds")
            worst = max(worst, math.inf if r["steps_differ"] or r["dropout_differ"] or r["sets_differ"] else 0.0)
            continue
        r = compare(authors, f, a.clients, a.seeds, a.rounds, a.per_round, a.warmup, a.protocol)
        ratio = r["tv_fedsel"] / r["tv_reference"]
        worst = max(worst, ratio)
        label = "with its warm-up epoch" if a.warmup else "without its warm-up epoch (fedsel's departure)"
        print(f"federation {f}, fedsel {a.protocol}, the code {label}: TV(fedsel, code) {r['tv_fedsel']:.3f}, code seed to seed "
              f"{r['tv_reference']:.3f} (ratio {ratio:.2f}); fastest fifth's share of trained picks fedsel "
              f"{r['fast_fedsel']:.1%}, code {r['fast_authors']:.1%}")
    return 0 if worst <= a.ratio else 1


if __name__ == "__main__":
    sys.exit(main())
