#!/usr/bin/env python3
"""fedsel's FedBalancer beside its authors' code, fed the same reports.

The reference is jaemin-shin/FedBalancer at commit 1d187c8: `models/fedbalancer.py` (Alg. 2,
3, 4: `loss_threshold_selection`, `ratio_control`, `deadline_selection`/`findPeakDDLE`) and
`models/oort.py` (their Oort variant with FedBalancer's utility, `select_clients`), imported
from `--checkout` over empty stand-ins for what they import and never call here (`torch`,
`timeout_decorator`, their `utils.logger`). Their `server.py`, `client.py` and `main.py` are
read for the order of the calls and what is fed to them: the driver plays their server.

Three comparisons:

1. *Injected lockstep* (Python package): random server states (every report's minimum and
   80th percentile, each client's reported times, the ratios, the guard time) are loaded
   into `fedsel.Selector("fedbalancer")` with `load_state`; its `select` runs Alg. 2 and 4
   and `state()` gives the threshold and deadline; the authors' `FedBalancer` gets the
   same lists and stand-in clients for the same selection. Max relative difference.
2. *Run lockstep* (fedsel's CLI, `--fedsel-bin`): a small synthetic run with a `[system]`
   clock and round policy `deadline`, checkpointed every round (a run of R rounds leaves
   the state after round R − 2, so R = 2..N+1 give every round). Round by round, the
   authors' Alg. 2, 3 and 4 are fed what fedsel's server held before the round (its
   reported minima and 80th percentiles, its loss-per-second history, its clients' times,
   ratios and guard time) and the round's selection, and the threshold, deadline and both
   ratios they give are compared with fedsel's after the round.
3. *Selection frequencies* (Python package): Oort-style selection with FedBalancer's
   statistical utility √(Σℓ²/n)·n over the losses above the threshold, on a synthetic
   federation whose per-sample losses are the same function of (client, participations)
   on both sides; TV distance over S seeds against the reference's own seed-to-seed TV.

fedsel departs from the authors' code on purpose (module doc of
crates/fedsel/src/select/fedbalancer.rs); the fair comparison gives the reference the same:
- *inference pipelining*: the authors' object is built with `fb_inference_pipelining =
  False` (their `config.py` default; the shipped run sets True), fedsel's only mode;
- *Oort*: fedsel selects with its own Oort (FedScale's rules) and FedBalancer's utility,
  so the fair reference for (3) is FedScale 1.0's Oort (the wheel, as
  `oort_fedscale.py` loads it, with that driver's four departures) fed the utility
  FedBalancer's `oort.py:93-106` gives each client; the authors' `oort.py` as it is
  (pacer off, penalty (T/t)^8 against the first deadline, as the shipped run) is printed
  beside it;
- *expected times* (Alg. 4): fedsel uses the mean of a client's last five training times;
  the authors' `findPeakDDLE` uses ceil(mean of the last five kept counts / B) batches at
  the mean batch time. Fair: the stand-in client carries one kept count of one batch at
  fedsel's mean time; as is (lockstep 1 only, where the kept counts are known): the
  counts and the batch time. A selected client that never reported is expected at its
  registered round trip (fair stand-in: that time as its forward pass, no training);
- *the first deadline* leaves out the forward pass (`main.py:110-111`); it is printed, not
  compared. `main.py:122` also truncates it to an integer (`int(np.mean(...))`), which the
  module doc does not list: the driver prints both.

What cannot be compared from outside fedsel's Rust: Alg. 1 (the kept samples), because
neither the Python package nor the CLI's outputs expose `SampleRule::choose` or the
clients' per-sample losses (fedsel-py's `Selector` has no `sample_rule` and no
`observe_samples`); and the guard time's rule, which the authors keep inside their
server's round loop (`server.py:433-446`, `:486-488`), not in a function (fedsel's value is
given to both sides).

Prints the figures; exits 1 when a lockstep difference exceeds `--tol` or fedsel's TV to
the fair reference exceeds `--ratio` times the reference's own on any federation.

    python scripts/reference/fedbalancer_authors.py --checkout /tmp/FedBalancer \
        [--fedsel-bin /tmp/fedsel-bin] [--seeds 30] [--rounds 100] [--trials 200]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import random
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from frequency import tv
from stand_ins import import_over

BATCH, EPOCHS = 10, 5


# --- the authors' code -------------------------------------------------------------------

def load_authors(checkout: Path):
    """`models/fedbalancer.py` and `models/oort.py` over stand-ins for their imports."""
    models = checkout / "models"
    for name in ("fedbalancer.py", "oort.py"):
        if not (models / name).is_file():
            raise SystemExit(f"{models / name} is missing: pass a checkout of jaemin-shin/FedBalancer at 1d187c8")
    logger_mod = types.ModuleType("utils.logger")

    class Logger:
        def get_logger(self):
            return logging.getLogger("fedbalancer-authors")

    logger_mod.Logger = Logger
    utils = types.ModuleType("utils")
    utils.logger = logger_mod
    stand_ins = {
        "torch": types.ModuleType("torch"),
        "timeout_decorator": types.ModuleType("timeout_decorator"),
        "utils": utils,
        "utils.logger": logger_mod,
    }
    fb = import_over("fb_authors_fedbalancer", models / "fedbalancer.py", stand_ins)
    oort = import_over("fb_authors_oort", models / "oort.py", stand_ins)
    return fb, oort


def authors_balancer(fb, state: dict, lt_step=0.05, ddl_step=0.05, w=20):
    """The authors' FedBalancer holding fedsel's server state (`state`: its fedbalancer
    part), pipelining off (fedsel's only mode), fb_p as their config stores it (1 − 1.0)."""
    b = fb.FedBalancer(False, 0.0, w, lt_step, ddl_step)
    b.loss_threshold = state["loss_threshold"]
    b.loss_threshold_ratio = state["lt_ratio"]
    b.deadline_ratio = state["ddl_ratio"]
    b.guard_time = state["guard_s"]
    b.current_round_loss_min = list(state["loss_mins"])
    b.current_round_loss_max = list(state["loss_p80s"])
    b.prev_train_losses = list(state["round_losses"])
    return b


class Device:
    def __init__(self, transfer_s: float):
        self.transfer_s = transfer_s

    def get_expected_download_time(self):
        return self.transfer_s

    def get_expected_upload_time(self):
        return self.transfer_s


def stand_in_client(k: int, times: dict | None, registered: float, kept=None, batch_s=None):
    """Client `k` as `findPeakDDLE` reads it. Fair (fedsel's departure): one kept count of
    one batch at fedsel's mean one-epoch training time; as is: the last five kept counts
    `kept` at `batch_s` a batch. Never reported: its registered round trip, as fedsel."""
    if times is None:
        return SimpleNamespace(id=k, device=Device(0.0), inference_times_per_sample=[registered], num_train_samples=1,
                               trained_num_of_samples=[1], per_batch_train_times=[0.0])
    c = SimpleNamespace(id=k, device=Device(times["transfer_s"]), inference_times_per_sample=[times["pass_s"]],
                        num_train_samples=1)
    if kept is None:
        c.trained_num_of_samples, c.per_batch_train_times = [1], [float(np.mean(times["low_s"]))]
    else:
        c.trained_num_of_samples, c.per_batch_train_times = list(kept[-5:]), [batch_s]
    return c


def authors_server_step(fb, before: dict, selected: list[int], registered: list[float], clients=None,
                        ddl_step=0.05):
    """Alg. 2 then Alg. 4 as `server.py:135-140` runs them after the round's selection, on
    the state fedsel's server held before the round; (threshold, deadline)."""
    b = authors_balancer(fb, before, ddl_step=ddl_step)
    n = len(before["times"])
    if not before["loss_mins"]:  # if_any_client_sent_response_for_current_round is False
        return b.loss_threshold, before["deadline_s"]
    b.loss_threshold_selection()
    deadline = before["deadline_s"]
    if ddl_step != 0.0 and selected:
        info = {str(k): {"one_epoch_train_time": -1 if before["times"][k] is None else 1.0} for k in range(n)}
        objs = clients(selected) if clients else [stand_in_client(k, before["times"][k], registered[k]) for k in selected]
        deadline = b.deadline_selection(objs, info, EPOCHS, deadline, BATCH, 0)
    return float(b.loss_threshold), float(deadline)


def authors_ratio_step(fb, before: dict, round_losses: list[float], current_round: int, w: int):
    """Alg. 3 (`server.py:413-419`) after a round: (lt_ratio, ddl_ratio)."""
    b = authors_balancer(fb, before, w=w)
    b.ratio_control(list(round_losses), current_round)
    return b.loss_threshold_ratio, b.deadline_ratio


def rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-300)


# --- 1: injected lockstep ------------------------------------------------------------------

def injected_lockstep(fb, trials: int, seed: int = 7):
    import fedsel

    rng = np.random.default_rng(seed)
    worst = {"threshold": 0.0, "deadline": 0.0, "deadline as is": 0.0}
    moved = 0
    for _ in range(trials):
        n = int(rng.integers(8, 40))
        k = int(rng.integers(2, min(n, 12)))
        sizes = [int(s) for s in rng.integers(20, 300, n)]
        registered = [float(x) for x in np.exp(rng.normal(math.log(30.0), 0.7, n))]
        sel = fedsel.Selector("fedbalancer", sizes=sizes, per_round=k, rounds=10, seed=int(rng.integers(1 << 30)),
                              durations=registered)
        st = sel.state()
        f = st["selector"]["fedbalancer"]
        reports = int(rng.integers(1, 60))
        mins = rng.uniform(0.05, 1.0, reports)
        f["loss_mins"] = [float(x) for x in mins]
        f["loss_p80s"] = [float(x + y) for x, y in zip(mins, rng.uniform(0.1, 2.0, reports))]
        f["lt_ratio"] = float(rng.choice([0.0, 0.05, 0.3, 0.65, 1.0]))
        f["loss_threshold"] = float(rng.choice([0.0, 0.4]))
        f["ddl_ratio"] = float(rng.choice([0.0, 0.25, 0.5, 0.95, 1.0]))
        f["guard_s"] = float(rng.choice([0.0, 0.0, 10.0]))
        explored = rng.random(n) < rng.uniform(0.3, 1.0)
        kept_hist, batch_s = {}, {}
        times = []
        for c in range(n):
            if not explored[c]:
                times.append(None)
                continue
            b_s = float(rng.uniform(0.05, 1.5))
            kept = [int(x) for x in rng.integers(1, sizes[c] + 1, int(rng.integers(1, 6)))]
            low = [math.ceil(m / BATCH) * b_s for m in kept]
            times.append({"transfer_s": float(rng.uniform(0.1, 5.0)), "pass_s": float(sizes[c] * rng.uniform(0.001, 0.02)),
                          "low_s": low, "high_s": [EPOCHS * x for x in low]})
            kept_hist[c], batch_s[c] = kept, b_s
        f["times"] = times
        before = copy.deepcopy(f)
        sel.load_state(st)
        selected = [int(c) for c in sel.select(0, available=list(range(n)), budget=k, query=None)]
        after = sel.state()["selector"]["fedbalancer"]
        th, dl = authors_server_step(fb, before, selected, registered)
        worst["threshold"] = max(worst["threshold"], rel(after["loss_threshold"], th))
        worst["deadline"] = max(worst["deadline"], rel(after["deadline_s"], dl))
        moved += after["deadline_s"] != before["deadline_s"]

        def as_is(ks):
            return [stand_in_client(c, before["times"][c], registered[c], kept_hist.get(c), batch_s.get(c)) for c in ks]

        _, dl_is = authors_server_step(fb, before, selected, registered, clients=as_is)
        worst["deadline as is"] = max(worst["deadline as is"], rel(after["deadline_s"], dl_is))
    return worst, moved


# --- 2: run lockstep (fedsel's CLI) --------------------------------------------------------

CLI_CONFIG = """name = "fb-ref"
seed = {seed}
rounds = {rounds}
targets = [0.6]
checkpoint_every = 1
[train]
batch_size = {batch}
work = {{ epochs = {epochs} }}
[system]
kind = "lognormal"
round = {{ policy = "deadline", deadline_s = 100.0 }}
[selection]
strategy = "fedbalancer"
[selection.fedbalancer]
fb_w = {w}
"""


def cli_states(binary: Path, rounds: int, seed: int, w: int, tmp: Path):
    """fedsel's server state after each round 0..rounds−1, its clients' registered round
    trips and the first deadline (the run's `clients.csv`/checkpoints)."""
    cfg = tmp / "fb.toml"
    cfg.write_text(CLI_CONFIG.format(seed=seed, rounds=2, batch=BATCH, epochs=EPOCHS, w=w))
    states = []
    for r in range(2, rounds + 2):
        out = tmp / f"r{r}"
        subprocess.run([str(binary), "run", str(cfg), "--set", f"rounds={r}", "--out", str(out), "--overwrite"],
                       check=True, capture_output=True, timeout=120)
        meta = json.loads((out / "checkpoint" / "state.json").read_text())["meta"]
        if meta["next_round"] != r - 1:
            raise RuntimeError(f"a run of {r} rounds left the checkpoint of round {meta['next_round']}, not {r - 1}")
        states.append(meta["selector"])
    return states


def run_lockstep(fb, binary: Path, rounds: int, seed: int, w: int):
    with tempfile.TemporaryDirectory() as tmp:
        states = cli_states(binary, rounds, seed, w, Path(tmp))
    f0 = states[0]["fedbalancer"]
    # The registered round trips: Oort's durations of the clients not yet selected; fedsel
    # reads them only for a client that never reported.
    registered = [None] * len(f0["times"])
    for st in states:
        for k, (d, c) in enumerate(zip(st["oort"]["duration"], st["oort"]["count"])):
            if c == 0:
                registered[k] = d
    worst = {"threshold": 0.0, "deadline": 0.0, "lt_ratio": 0.0, "ddl_ratio": 0.0}
    counts = {"deadline moves": 0, "lt_ratio moves": 0, "nonzero thresholds": 0, "rounds": len(states) - 1,
              "rounds without reports": 0}
    for j in range(1, len(states)):
        before, after = states[j - 1]["fedbalancer"], states[j]["fedbalancer"]
        th, dl = authors_server_step(fb, before, after["selected"], registered)
        worst["threshold"] = max(worst["threshold"], rel(after["loss_threshold"], th))
        worst["deadline"] = max(worst["deadline"], rel(after["deadline_s"], dl))
        counts["deadline moves"] += after["deadline_s"] != before["deadline_s"]
        counts["nonzero thresholds"] += after["loss_threshold"] != 0.0
        if after["rounds"] > before["rounds"]:
            mid = dict(before, loss_threshold=after["loss_threshold"])
            lt, ddl = authors_ratio_step(fb, mid, after["round_losses"], after["rounds"] - 1, w)
            worst["lt_ratio"] = max(worst["lt_ratio"], abs(after["lt_ratio"] - lt))
            worst["ddl_ratio"] = max(worst["ddl_ratio"], abs(after["ddl_ratio"] - ddl))
            counts["lt_ratio moves"] += after["lt_ratio"] != before["lt_ratio"]
        # The authors count every round (server.current_round), fedsel the rounds with reports.
        counts["rounds without reports"] += after["rounds"] - 1 != j
    return worst, counts, f0["deadline_s"]


# --- 3: selection frequencies --------------------------------------------------------------

class Federation:
    def __init__(self, seed: int, n: int = 60):
        rng = np.random.default_rng(20_000 + seed)
        self.seed = seed
        self.sizes = [int(s) for s in rng.integers(20, 201, n)]
        self.durations = [float(d) for d in np.exp(rng.normal(math.log(30.0), 0.8, n))]
        self.base = [float(b) for b in rng.uniform(0.5, 2.5, n)]

    def losses(self, k: int, trained: int) -> np.ndarray:
        """Client k's per-sample losses after `trained` participations (the same on both sides)."""
        g = np.random.default_rng([self.seed, k, trained])
        return self.base[k] * 0.9**trained * g.exponential(1.0, self.sizes[k])


class Thresholds:
    """Alg. 2 at a fixed ratio (the authors' code), over the run's own reports."""

    def __init__(self, fb, ratio: float = 0.3):
        self.b = fb.FedBalancer(False, 0.0, 20, 0.0, 0.0)
        self.b.loss_threshold_ratio = ratio

    def report(self, losses: np.ndarray):
        """The client's report against the round's threshold: (Σ ℓ² over, n over)."""
        over = losses[losses > self.b.loss_threshold]
        self.b.current_round_loss_min.append(float(np.min(losses)))
        self.b.current_round_loss_max.append(float(np.percentile(losses, 80)))
        return float((over**2).sum()), int(over.size)

    def next_round(self):
        self.b.loss_threshold_selection()


def fb_utility(oort_mod, sq: float, cnt: int) -> float:
    """The utility FedBalancer's `oort.py:93-106` gives a client, read back from the
    `clients_info[...]["utility"]` their `select_clients` writes (a second client with
    nothing reported keeps the call valid; NumPy's stream is restored after it)."""
    info = {"0": {"overthreshold_loss_count": cnt, "overthreshold_loss_sum": sq},
            "1": {"overthreshold_loss_count": -1, "overthreshold_loss_sum": -1}}
    for v in info.values():
        v.update(last_selected_round=-1, one_epoch_train_time=1.0)
    cs = [SimpleNamespace(id=i, device=Device(0.0), inference_times_per_sample=[0.0], num_train_samples=1,
                          trained_num_of_samples=[1], per_batch_train_times=[0.0]) for i in range(2)]
    o = oort_mod.Oort(cs, 1e9, oort_pacer=False)
    o.epsilon = 0.0
    np_state = np.random.get_state()
    o.select_clients(cs, cs, 1, info, 1, 1e9, BATCH, EPOCHS, fb_client_selection=True)
    np.random.set_state(np_state)
    return float(info["0"]["utility"])


def run_fedsel(fed: Federation, fb, oort_mod, seed: int, rounds: int, k: int):
    import fedsel

    n = len(fed.sizes)
    sel = fedsel.Selector("fedbalancer", sizes=fed.sizes, per_round=k, rounds=rounds, seed=seed, durations=fed.durations)
    th, counts, trained = Thresholds(fb), np.zeros(n), [0] * n
    for r in range(rounds):
        picked = [int(c) for c in sel.select(r, available=list(range(n)), budget=k, query=None)]
        utils = []
        for c in picked:
            counts[c] += 1
            utils.append(fb_utility(oort_mod, *th.report(fed.losses(c, trained[c]))))
            trained[c] += 1
        # fedsel-py reaches Oort's utility through the mean training loss (n_k·|loss|):
        # FedBalancer's utility is handed over as utility / n_k.
        sel.observe(picked, train_losses=[u / fed.sizes[c] for u, c in zip(utils, picked)],
                    durations=[fed.durations[c] for c in picked])
        th.next_round()
    return counts


def run_fedscale(fed: Federation, fb, oort_mod, fedscale, seed: int, rounds: int, k: int):
    """FedScale's Oort with oort_fedscale.py's four departures, fed FedBalancer's utility."""
    import oort_fedscale as ofs

    n = len(fed.sizes)
    sel = ofs.with_fedsel_departures(fedscale)(ofs.fedscale_args(max(fed.sizes)), sample_seed=seed)
    for c in range(n):
        sel.register_client(c, {"reward": fed.sizes[c], "duration": fed.durations[c]})
    th, counts, trained = Thresholds(fb), np.zeros(n), [0] * n
    for r in range(1, rounds + 1):
        picked = ofs.explore_first(sel, k) if r == 1 else [int(c) for c in sel.select_participant(k, feasible_clients=set(range(n)))]
        for c in dict.fromkeys(picked):
            counts[c] += 1
            u = fb_utility(oort_mod, *th.report(fed.losses(c, trained[c])))
            trained[c] += 1
            sel.update_client_util(c, {"reward": u, "duration": fed.durations[c], "time_stamp": r, "status": True})
        th.next_round()
    return counts


def run_authors_oort(fed: Federation, fb, oort_mod, seed: int, rounds: int, k: int):
    """The authors' `oort.py` as it is (shipped run: pacer off, so the penalty (T/t)^8 is
    against the first deadline, `main.py`'s int(mean round trip)), driven as `server.py`."""
    n = len(fed.sizes)
    np.random.seed(seed)
    random.seed(seed)
    clients = [SimpleNamespace(id=c, device=Device(fed.durations[c] / 2), inference_times_per_sample=[0.0],
                               num_train_samples=fed.sizes[c], trained_num_of_samples=[BATCH],
                               per_batch_train_times=[0.0]) for c in range(n)]
    info = {str(c): {"one_epoch_train_time": -1, "overthreshold_loss_count": -1, "overthreshold_loss_sum": -1,
                     "utility": 0.0, "last_selected_round": -1} for c in range(n)}
    deadline = int(np.mean(fed.durations))
    o = oort_mod.Oort(clients, deadline, oort_pacer=False)
    th, counts, trained = Thresholds(fb), np.zeros(n), [0] * n
    for r in range(rounds):
        picked, info = o.select_clients(clients, clients, k, info, r, deadline, BATCH, EPOCHS, fb_client_selection=True)
        for obj in picked:
            c = obj.id
            counts[c] += 1
            sq, cnt = th.report(fed.losses(c, trained[c]))
            trained[c] += 1
            info[str(c)].update(overthreshold_loss_sum=sq, overthreshold_loss_count=cnt, one_epoch_train_time=1.0)
        th.next_round()
        if o.epsilon != 0:
            o.zero_epsilon(clients, info)
    return counts


def frequencies(fb, oort_mod, fedscale, fed_seed: int, seeds: int, rounds: int, k: int):
    fed = Federation(fed_seed)
    n = len(fed.sizes)
    ours, ref, ref2, auth, auth2 = (np.zeros(n) for _ in range(5))
    for s in range(1, seeds + 1):
        ours += run_fedsel(fed, fb, oort_mod, s, rounds, k)
        if fedscale is not None:
            ref += run_fedscale(fed, fb, oort_mod, fedscale, s, rounds, k)
            ref2 += run_fedscale(fed, fb, oort_mod, fedscale, seeds + s, rounds, k)
        auth += run_authors_oort(fed, fb, oort_mod, s, rounds, k)
        auth2 += run_authors_oort(fed, fb, oort_mod, seeds + s, rounds, k)
    out = {"as is": (tv(ours, auth), tv(auth2, auth))}
    if fedscale is not None:
        out["fair"] = (tv(ours, ref), tv(ref2, ref))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help="jaemin-shin/FedBalancer at 1d187c8")
    p.add_argument("--fedsel-bin", type=Path, default=Path("/tmp/fedsel-bin"), help="fedsel's CLI (lockstep 2)")
    p.add_argument("--cli-rounds", type=int, default=40)
    p.add_argument("--cli-seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--fb-w", type=int, default=5, help="fb_w of the CLI run (20, the shipped value, moves later)")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--federations", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--tol", type=float, default=1e-9)
    a = p.parse_args(argv)
    fb, oort_mod = load_authors(a.checkout)
    failed = False

    worst, moved = injected_lockstep(fb, a.trials)
    print(f"lockstep 1 (injected states, {a.trials} trials, deadline moved in {moved}): max rel. diff "
          f"threshold {worst['threshold']:.2e}, deadline {worst['deadline']:.2e}; "
          f"authors' expected times as is: deadline {worst['deadline as is']:.2e}")
    failed |= max(worst["threshold"], worst["deadline"]) > a.tol

    if a.fedsel_bin.is_file():
        for seed in a.cli_seeds:
            w2, counts, first = run_lockstep(fb, a.fedsel_bin, a.cli_rounds, seed, a.fb_w)
            print(f"lockstep 2 (fedsel CLI run, seed {seed}, {counts['rounds']} rounds, fb_w {a.fb_w}; deadline moved "
                  f"{counts['deadline moves']}×, lt_ratio {counts['lt_ratio moves']}×, threshold > 0 in "
                  f"{counts['nonzero thresholds']}): max rel. diff threshold {w2['threshold']:.2e}, deadline "
                  f"{w2['deadline']:.2e}; max abs. diff lt_ratio {w2['lt_ratio']:.2e}, ddl_ratio {w2['ddl_ratio']:.2e}; "
                  f"rounds without reports {counts['rounds without reports']}; first deadline {first:.3f} s "
                  f"(main.py:122's int(): {int(first)} s, not compared)")
            failed |= max(w2.values()) > a.tol
    else:
        print(f"lockstep 2 skipped: no fedsel CLI at {a.fedsel_bin}")

    fedscale = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            import oort_fedscale as ofs

            fedscale = ofs.load_fedscale_oort(Path(tmp))
        except Exception as e:  # Unavailable, or no network
            print(f"fair frequency reference skipped ({e}); the authors' Oort as is only")
        for f in a.federations:
            r = frequencies(fb, oort_mod, fedscale, f, a.seeds, a.rounds, a.per_round)
            line = f"federation {f}:"
            if "fair" in r:
                t, floor = r["fair"]
                line += f" TV(fedsel, FedScale Oort + FB utility) {t:.3f} vs its seed to seed {floor:.3f} (ratio {t / floor:.2f});"
                failed |= t > a.ratio * floor
            t, floor = r["as is"]
            line += f" TV(fedsel, authors' oort.py as is) {t:.3f} vs its seed to seed {floor:.3f} (ratio {t / floor:.2f})"
            print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
