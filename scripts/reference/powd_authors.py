"""Power-of-choice (pow-d) beside the FedCor and HiCS-FL authors' own, on the same losses.

Both papers run pow-d (Cho et al.) as a baseline, and neither has it as a function:
- FedCor (github.com/Yoruko-Tang/FedCor, commit d941083ce2840e877476182d898c1ffa878d599b),
  `src/federated_main.py`, the `elif args.power_d:` branch of the round loop: d candidates
  drawn by `np.random.choice(range(N), d, replace=False, p=weights)` (weights = n_k / Σ n),
  then the m with the highest loss of the global model (`gt_global_losses[-1]`, every
  client's loss after the last round) by `np.argsort(...)[-m:]`. The global generator is
  seeded once per run (`setup_seed`). The driver parses the file with `ast`, finds that
  branch and executes its statements, unchanged, in a namespace holding `args.num_users`,
  `args.d`, `weights`, `gt_global_losses`, `m` and `np`: nothing of it is copied here.
- HiCS-FL (github.com/CityChan/HiCS-FL, commit 25f309d118d72c8ca176b6551704f648b304e100),
  `server/server_poc.py`, `Server_PowOfChoice.train`: round 0 draws K clients ∝ n_k (no
  losses yet); each later round 2K candidates ∝ n_k, then the K with the highest training
  loss of the global model, which `train` measures on every client after each round
  (`Client_base.train_loss`). `np.random.seed(epoch)` starts every round. The driver runs
  `train` itself on an object made without `__init__` (which loads data and builds models),
  given `args` (`n_clients`, `frac` = (K + ½)/N so that `int(frac · N)` = K, `epochs`,
  `exp`), `weights` = n_k / Σ n as `__init__` computes it, stand-in clients whose
  `local_training` records the pick and whose `train_loss` answers from the driver's loss
  stream, a stand-in model, and `global_acc` (test accuracy, nothing to select with) a
  no-op. The imports `train` never uses for selection are stand-ins: `torch` (its
  `torch.save` of the final weights does nothing), `torch.nn`, `torch.optim`,
  `torch.utils.data`, `torchvision.models`, `scipy.spatial.distance`, `progress.bar`, `tqdm`
  (the identity), their `client.client_base`, `cnn`, `sampling` and `utils`
  (`average_weights` returns an empty state). Their `print`s are silenced by a module-level
  `print`; their JSON record goes to a temporary directory.

fedsel's side is `fedsel.Selector("powd", d_per_m=2)` (d = 2K, FedCor App. C.1's d = 2m
and the HiCS-FL code's 2K), whose query's `losses(clients)` answers with the same loss
vector, every client available.

The loss stream: client k's loss at round t is base_k · 0.9^c · exp(0.1 z_{t,k}), c its
participations so far, base_k ~ U(0.5, 2.5) and z_{t,k} ~ N(0, 1) fixed per federation
(the same on both sides, whatever they pick); `--ties` rounds it to a grid of 0.25, so that
equal losses are common. Sizes are drawn in 50..400 (`--equal-sizes`: all 100).

Compared:
  - lockstep: fedsel draws its candidates, and the authors' code is handed that draw as the
    result of its `np.random.choice` (after checking that it asked for d distinct clients of
    N, ∝ the same weights); the chosen sets must be equal. A differing round is `tie` when
    the two sets differ only by clients whose loss equals the K-th largest candidate loss,
    else `other`. HiCS-FL's round 0 (K ∝ n_k, no pow-d) is handed fedsel's picks and is not
    compared;
  - free running: per-client selection frequencies over S seeds × R rounds, the
    total-variation distance (TV) between fedsel's (seeds 1..S) and the authors' (seeds
    1..S), against the authors' own (seeds S+1..2S against 1..S). FedCor's generator is
    seeded with the run's seed; HiCS-FL's `np.random.seed(epoch)` makes every run draw the
    same candidates in round t whatever its seed, so the spread across seeds needs a
    per-run seed: `np.random.seed(epoch)` is given `[seed, epoch]` (the driver prints what
    their code as it is does too);
    HiCS-FL's is printed from round 1 on too, and from round 1 on with their round 0 given
    fedsel's departure (its K ∝ n_k draw answered with fedsel's pow-d round 0 on a stream of
    its own): round 0 moves the participation counts, so its effect outlasts it;
  - HiCS-FL's round 0 alone, over `--round0-seeds` seeds: TV of fedsel's pow-d round 0 and
    their K ∝ n_k draw, against their own.
Of equal losses at the K-th place, fedsel keeps the earliest drawn (its stable descending
sort); their `np.argsort(...)[-m:]` keeps whichever NumPy's default sort leaves last, which
depends on the NumPy build and the CPU (NumPy 2.4 with AVX-512 sorts out of order);
`--stable-argsort` gives their `np.argsort` NumPy's stable sort, which keeps the latest
drawn. The lockstep line counts which of the tied each side kept. Exits 1 when a lockstep
round differs other than by a tie, or a TV exceeds `--ratio` times the authors' own.

Usage:
    git clone https://github.com/Yoruko-Tang/FedCor /tmp/FedCor && git -C /tmp/FedCor checkout d941083ce2840e877476182d898c1ffa878d599b
    git clone https://github.com/CityChan/HiCS-FL /tmp/HiCS-FL && git -C /tmp/HiCS-FL checkout 25f309d118d72c8ca176b6551704f648b304e100
    python scripts/reference/powd_authors.py --fedcor /tmp/FedCor --hics /tmp/HiCS-FL [--clients 100] [--per-round 5] [--rounds 100] [--seeds 30] [--federation 1] [--equal-sizes] [--ties] [--stable-argsort]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy

from frequency import tv
from stand_ins import import_over

FEDCOR_COMMIT = "d941083ce2840e877476182d898c1ffa878d599b"
HICS_COMMIT = "25f309d118d72c8ca176b6551704f648b304e100"


class BranchNotFound(RuntimeError):
    """The authors' file holds no pow-d branch where the driver looks for it."""


@dataclass
class Federation:
    """Sizes and the loss stream both sides are fed."""

    sizes: list[int]
    base: numpy.ndarray
    noise: numpy.ndarray
    ties: bool

    @staticmethod
    def build(seed: int, n: int, rounds: int, equal_sizes: bool = False, ties: bool = False) -> "Federation":
        rng = numpy.random.default_rng(10_000 + seed)
        sizes = [100] * n if equal_sizes else [int(s) for s in rng.integers(50, 401, n)]
        base = rng.uniform(0.5, 2.5, n)
        # rounds + 1: HiCS-FL's `train` measures every loss after its last round too
        noise = numpy.random.default_rng(20_000 + seed).standard_normal((rounds + 1, n))
        return Federation(sizes, base, noise, ties)

    @property
    def weights(self) -> numpy.ndarray:
        n = numpy.array(self.sizes)
        return n / numpy.sum(n)  # as both authors' codes compute p_k

    def loss(self, k: int, trained: int, t: int) -> float:
        """Client k's loss of the global model at the selection of round t."""
        v = self.base[k] * 0.9**trained * numpy.exp(0.1 * self.noise[t, k])
        return float(numpy.round(v * 4) / 4) if self.ties else float(v)


@dataclass
class Play:
    """One run's state: participation counts, and each round's picks."""

    fed: Federation
    counts: numpy.ndarray
    round: int = 0
    picks: list = field(default_factory=list)

    @staticmethod
    def new(fed: Federation) -> "Play":
        return Play(fed, numpy.zeros(len(fed.sizes), dtype=int))

    def losses(self, t: int) -> list[float]:
        return [self.fed.loss(k, int(self.counts[k]), t) for k in range(len(self.fed.sizes))]

    def trained(self, chosen):
        self.picks.append(sorted(int(k) for k in chosen))
        for k in chosen:
            self.counts[k] += 1


class Losses:
    """fedsel's query: the round's losses, recording the candidates it is asked about."""

    def __init__(self, play: Play, t: int):
        self.play, self.t, self.asked = play, t, None

    def losses(self, clients):
        self.asked = list(clients)
        return [self.play.fed.loss(k, int(self.play.counts[k]), self.t) for k in clients]


def fedsel_round(sel, play: Play, t: int, k: int):
    """fedsel's selection of round t: its picks and its candidates in draw order."""
    q = Losses(play, t)
    picked = sel.select(t, list(range(len(play.fed.sizes))), k, q)
    sel.observe(picked, train_losses=[play.fed.loss(c, int(play.counts[c]), t) for c in picked])
    return picked, q.asked


def new_selector(fed: Federation, k: int, rounds: int, seed: int):
    import fedsel

    return fedsel.Selector("powd", sizes=fed.sizes, per_round=k, rounds=rounds, seed=seed, d_per_m=2)


class RandomFor:
    """Stands in for `np.random` in the authors' code: NumPy's, with `seed` mapped by
    `seed_of` and `choice` optionally answered by `hook`."""

    def __init__(self, seed_of=None, hook=None):
        self.seed_of, self.hook, self.epoch = seed_of, hook, None

    def seed(self, s):
        self.epoch = s
        numpy.random.seed(self.seed_of(s) if self.seed_of else s)

    def choice(self, a, size=None, replace=True, p=None):
        if self.hook is None:
            return numpy.random.choice(a, size, replace=replace, p=p)
        return self.hook(a, size, replace, p, self.epoch)

    def __getattr__(self, name):
        return getattr(numpy.random, name)


class NumpyFor:
    """Stands in for the authors' `np`: NumPy, with `random` a `RandomFor`; `stable` makes
    `argsort` NumPy's stable sort (which of equal losses their `np.argsort` leaves last
    depends on the NumPy build and the CPU)."""

    def __init__(self, random: RandomFor, stable: bool = False):
        self.random, self.stable = random, stable

    def argsort(self, a, *args, **kwargs):
        return numpy.argsort(a, kind="stable") if self.stable else numpy.argsort(a, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(numpy, name)


def handed(fixed, weights):
    """A `choice` hook that checks the authors' call (d distinct clients of N ∝ `weights`)
    and answers with `fixed(size, epoch)`."""

    def hook(a, size, replace, p, epoch):
        population = a if isinstance(a, int) else list(a)
        if population not in (len(weights), list(range(len(weights)))) or replace is not False or p is None \
                or not numpy.array_equal(p, weights):
            raise RuntimeError(f"the authors' draw is not d of the {len(weights)} clients ∝ n_k without "
                               f"replacement: choice({a!r}, {size}, replace={replace}, p={p})")
        drawn = fixed(size, epoch)
        if len(drawn) != size or len(set(drawn)) != size:
            raise RuntimeError(f"the authors' code asks for {size} candidates, fedsel drew {drawn}")
        return numpy.array(drawn)

    return hook


def tie_side(chosen, candidates, losses, k):
    """Which of the clients tied at the K-th largest candidate loss `chosen` keeps, in draw
    order: `earliest`, `latest` or `mixed`; None when no tie straddles the K-th place."""
    kth = sorted((losses[c] for c in candidates), reverse=True)[k - 1]
    tied = [c for c in candidates if losses[c] == kth]
    kept = [c for c in tied if c in set(chosen)]
    if len(kept) == len(tied):
        return None
    if kept == tied[: len(kept)]:
        return "earliest"
    return "latest" if kept == tied[-len(kept):] else "mixed"


def record(out, t, theirs, ours, candidates, losses, k):
    """Counts a lockstep round: `same`, `tie` (the sets differ only by clients at the K-th
    largest candidate loss) or `other`, and each side's tie break where a tie straddles K."""
    kth = sorted((losses[c] for c in candidates), reverse=True)[k - 1]
    if sorted(theirs) == sorted(ours):
        c = "same"
    elif all(losses[x] == kth for x in set(theirs) ^ set(ours)):
        c = "tie"
    else:
        c = "other"
        out["other_rounds"].append({"round": t, "authors": sorted(theirs), "fedsel": sorted(ours)})
    out[c] += 1
    for side, chosen in (("authors", theirs), ("fedsel", ours)):
        kept = tie_side(chosen, candidates, losses, k)
        if kept:
            out[f"{side}_tie_break"][kept] = out[f"{side}_tie_break"].get(kept, 0) + 1


def lockstep_record():
    return {"same": 0, "tie": 0, "other": 0, "other_rounds": [], "authors_tie_break": {}, "fedsel_tie_break": {}}


# ----- FedCor: the branch of federated_main.py -----


def fedcor_branch(checkout) -> types.CodeType:
    """The statements of the `elif args.power_d:` branch of FedCor's `src/federated_main.py`."""
    path = Path(checkout) / "src" / "federated_main.py"
    if not path.is_file():
        raise BranchNotFound(f"{path}: no such file (is {checkout} a checkout of Yoruko-Tang/FedCor?)")
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "args.power_d" and any(
            isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "idxs_users" for s in node.body
        ):
            return compile(ast.Module(body=node.body, type_ignores=[]), f"{path}:{node.lineno}", "exec")
    raise BranchNotFound(
        f"{path}: no `if`/`elif args.power_d:` branch assigning `idxs_users` (FedCor's pow-d, "
        f"commit {FEDCOR_COMMIT} has it in the round loop)"
    )


def fedcor_select(branch, np, fed: Federation, d: int, m: int, losses):
    ns = {"np": np, "args": SimpleNamespace(num_users=len(fed.sizes), d=d), "weights": fed.weights,
          "gt_global_losses": [losses], "m": m}
    exec(branch, ns)
    return [int(c) for c in ns["idxs_users"]]


def fedcor_run(branch, fed, k, rounds, seed, stable=False):
    """FedCor free running: the generator seeded once (`setup_seed`), the branch every round."""
    numpy.random.seed(seed)
    play = Play.new(fed)
    for t in range(rounds):
        play.trained(fedcor_select(branch, NumpyFor(RandomFor(), stable), fed, 2 * k, k, play.losses(t)))
    return play


def fedcor_lockstep(branch, fed, k, rounds, seed, stable=False):
    play = Play.new(fed)
    sel = new_selector(fed, k, rounds, seed)
    out = lockstep_record()
    for t in range(rounds):
        losses = play.losses(t)
        ours, cands = fedsel_round(sel, play, t, k)
        np = NumpyFor(RandomFor(hook=handed(lambda size, _e: cands, fed.weights)), stable)
        theirs = fedcor_select(branch, np, fed, 2 * k, k, losses)
        record(out, t, theirs, ours, cands, losses, k)
        play.trained(theirs)
    return out


# ----- HiCS-FL: Server_PowOfChoice.train -----


def _stand_ins():
    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    torch = mod("torch", save=lambda *a, **k: None)
    torch.nn = mod("torch.nn")
    torch.optim = mod("torch.optim")
    torch.utils = mod("torch.utils")
    torch.utils.data = mod("torch.utils.data", Dataset=object, DataLoader=None)
    scipy = mod("scipy")
    scipy.spatial = mod("scipy.spatial")
    scipy.spatial.distance = mod("scipy.spatial.distance", cdist=None)
    torchvision = mod("torchvision")
    torchvision.models = mod("torchvision.models", resnet18=None)
    progress = mod("progress")
    progress.bar = mod("progress.bar", Bar=None)
    client = mod("client")
    client.client_base = mod("client.client_base", Client_base=None)
    mods = [torch, torch.nn, torch.optim, torch.utils, torch.utils.data, scipy, scipy.spatial,
            scipy.spatial.distance, torchvision, torchvision.models, progress, progress.bar,
            client, client.client_base,
            mod("tqdm", tqdm=lambda it, *a, **k: it),
            mod("cnn", FMNIST_CNN=None, CIFAR10_CNN=None),
            mod("sampling", partition_data_various_alpha=None, partition_data_various_alpha_imagenet=None,
                LocalDataloaders=None),
            mod("utils", Accuracy=None, average_weights=lambda w: {})]
    return {m.__name__: m for m in mods}


def load_server_poc(checkout):
    """HiCS-FL's `server/server_poc.py`, imported over the stand-ins (sys.modules restored after)."""
    path = Path(checkout) / "server" / "server_poc.py"
    if not path.is_file():
        raise BranchNotFound(f"{path}: no such file (is {checkout} a checkout of CityChan/HiCS-FL?)")
    module = import_over("hics_server_poc", path, _stand_ins())
    if not hasattr(module, "Server_PowOfChoice") or not hasattr(module.Server_PowOfChoice, "train"):
        raise BranchNotFound(f"{path}: no `Server_PowOfChoice.train` (HiCS-FL's pow-d, commit {HICS_COMMIT})")
    module.print = lambda *a, **k: None
    return module


class Client:
    """A stand-in for their `Client_base`: trains by recording, reports the stream's loss."""

    def __init__(self, idx: int, play: Play, round_picks: list):
        self.idx, self.play, self.round_picks = idx, play, round_picks

    def load_model(self, w):
        pass

    def local_training(self):
        self.round_picks.append(self.idx)
        return {}, 0.0

    def local_accuracy(self):
        return 0.0

    def train_loss(self):
        # after the round's aggregation: the loss the next round's selection ranks by
        return self.play.fed.loss(self.idx, int(self.play.counts[self.idx]), self.play.round)


class Model:
    """A stand-in for the global model; its `load_state_dict` (once a round, after the
    aggregation) closes the round: the picks count as trained, the next losses are asked."""

    def __init__(self, play: Play, round_picks: list):
        self.play, self.round_picks = play, round_picks

    def state_dict(self):
        return {}

    def load_state_dict(self, w):
        self.play.trained(self.round_picks)
        self.round_picks.clear()
        self.play.round += 1


def hics_run(module, play: Play, k: int, rounds: int, np):
    """Their `train` for `rounds` epochs on `play`, `np` standing in for their NumPy."""
    fed = play.fed
    round_picks: list = []
    s = object.__new__(module.Server_PowOfChoice)
    n = len(fed.sizes)
    with tempfile.TemporaryDirectory() as tmp:
        s.args = {"n_clients": n, "frac": (k + 0.5) / n, "epochs": rounds, "exp": "powd"}
        s.clients = [Client(i, play, round_picks) for i in range(n)]
        s.weights = fed.weights
        s.global_model = Model(play, round_picks)
        s.global_acc = lambda: None
        s.Global_acc, s.Local_acc, s.Mean_loss = [], [], []
        s.ckpt_path = tmp + "/"
        saved = module.np
        module.np = np
        try:
            s.train()
        finally:
            module.np = saved
    return play


def hics_free(module, fed, k, rounds, seed, as_is=False, powd_round0=False, stable=False):
    """Their `train` free running. `powd_round0` gives it fedsel's departure in round 0: its
    K ∝ n_k draw is answered with the picks of fedsel's pow-d round 0 (seed 10 000 + the
    run's, a stream of its own); later rounds draw as theirs do."""
    play = Play.new(fed)

    def hook(a, size, replace, p, epoch):
        if epoch == 0:
            return numpy.array(fedsel_round(new_selector(fed, k, 1, 10_000 + seed), play, 0, k)[0])
        return numpy.random.choice(a, size, replace=replace, p=p)

    rnd = RandomFor(seed_of=None if as_is else (lambda e: [seed, e]), hook=hook if powd_round0 else None)
    return hics_run(module, play, k, rounds, NumpyFor(rnd, stable))


def hics_lockstep(module, fed, k, rounds, seed, stable=False):
    sel = new_selector(fed, k, rounds, seed)
    play = Play.new(fed)
    ours, cands, seen = {}, {}, {}

    def fixed(size, epoch):
        seen[epoch] = play.losses(epoch)
        ours[epoch], cands[epoch] = fedsel_round(sel, play, epoch, k)
        # round 0 (their K ∝ n_k draw, no pow-d) is handed fedsel's picks, not compared
        return ours[epoch] if epoch == 0 else cands[epoch]

    hics_run(module, play, k, rounds, NumpyFor(RandomFor(hook=handed(fixed, fed.weights)), stable))
    out = lockstep_record()
    for t in range(1, rounds):
        record(out, t, play.picks[t], ours[t], cands[t], seen[t], k)
    return out


# ----- frequencies -----


def fedsel_run(fed, k, rounds, seed):
    play = Play.new(fed)
    sel = new_selector(fed, k, rounds, seed)
    for t in range(rounds):
        play.trained(fedsel_round(sel, play, t, k)[0])
    return play


def counts(plays, n, first=0):
    c = numpy.zeros(n)
    for p in plays:
        for picks in p.picks[first:]:
            c[picks] += 1
    return c


def frequencies(authors_run, fed, k, rounds, seeds, first=0):
    """TV of fedsel's frequencies (seeds 1..S) to the authors' (1..S), and the authors' own
    (S+1..2S to 1..S), counting the rounds from `first` on."""
    n = len(fed.sizes)
    ref = counts([authors_run(s) for s in range(1, seeds + 1)], n, first)
    floor = counts([authors_run(seeds + s) for s in range(1, seeds + 1)], n, first)
    ours = counts([fedsel_run(fed, k, rounds, s) for s in range(1, seeds + 1)], n, first)
    out = {"tv_fedsel": tv(ours, ref), "tv_authors": tv(floor, ref)}
    if len(set(fed.sizes)) > 1:
        # the share of the picks the largest fifth of the clients gets: what the ∝ n_k draw moves
        large = numpy.argsort(fed.sizes, kind="stable")[-max(n // 5, 1):]
        out["largest_fifth_fedsel"] = float(ours[large].sum() / ours.sum())
        out["largest_fifth_authors"] = float(ref[large].sum() / ref.sum())
    return out


def hics_round0(module, fed, k, seeds):
    """Round 0 alone: fedsel's pow-d against their K ∝ n_k draw (per-run seeds)."""
    n = len(fed.sizes)
    ref = counts([hics_free(module, fed, k, 1, s) for s in range(1, seeds + 1)], n)
    floor = counts([hics_free(module, fed, k, 1, seeds + s) for s in range(1, seeds + 1)], n)
    ours = counts([fedsel_run(fed, k, 1, s) for s in range(1, seeds + 1)], n)
    return {"tv_fedsel": tv(ours, ref), "tv_authors": tv(floor, ref)}


def ratio(f):
    return f["tv_fedsel"] / f["tv_authors"] if f["tv_authors"] > 0 else float("inf")


def lockstep_line(lock):
    total = {c: sum(x[c] for x in lock) for c in ("same", "tie", "other")}
    breaks = {side: {} for side in ("authors", "fedsel")}
    for x in lock:
        for side in breaks:
            for key, v in x[f"{side}_tie_break"].items():
                breaks[side][key] = breaks[side].get(key, 0) + v
    return (f"same {total['same']}, tie {total['tie']}, other {total['other']}; where a tie straddles the K-th "
            f"place, the authors keep {breaks['authors'] or 'none'}, fedsel {breaks['fedsel'] or 'none'} "
            f"(of the tied, in draw order)")


def frequency_line(f):
    line = f"TV fedsel–authors {f['tv_fedsel']:.4f}, authors' own {f['tv_authors']:.4f} ({ratio(f):.2f}×)"
    if "largest_fifth_fedsel" in f:
        line += (f"; the largest fifth's share of the picks {100 * f['largest_fifth_fedsel']:.1f} % / "
                 f"{100 * f['largest_fifth_authors']:.1f} %")
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fedcor", help="a checkout of Yoruko-Tang/FedCor at " + FEDCOR_COMMIT)
    ap.add_argument("--hics", help="a checkout of CityChan/HiCS-FL at " + HICS_COMMIT)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--round0-seeds", type=int, default=1000)
    ap.add_argument("--federation", type=int, default=1)
    ap.add_argument("--equal-sizes", action="store_true")
    ap.add_argument("--ties", action="store_true", help="losses on a grid of 0.25 (ties common)")
    ap.add_argument("--stable-argsort", action="store_true",
                    help="their np.argsort as NumPy's stable sort: of equal losses, the latest drawn kept")
    ap.add_argument("--ratio", type=float, default=1.5, help="exit 1 when a TV exceeds this times the authors' own")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if not (args.fedcor or args.hics):
        ap.error("give --fedcor, --hics or both")

    n, k, R, S, st = args.clients, args.per_round, args.rounds, args.seeds, args.stable_argsort
    fed = Federation.build(args.federation, n, R, args.equal_sizes, args.ties)
    figures = {"clients": n, "per_round": k, "d": 2 * k, "rounds": R, "seeds": S, "federation": args.federation,
               "equal_sizes": args.equal_sizes, "ties": args.ties, "stable_argsort": st}
    what = (f"N = {n}, K = {k}, d = {2 * k}, {R} rounds, federation {args.federation}, "
            f"{'equal sizes' if args.equal_sizes else 'sizes 50-400'}, "
            f"{'losses on a 0.25 grid' if args.ties else 'continuous losses'}"
            f"{', their argsort stable' if st else ''}")
    print(what)
    failed = False
    if args.fedcor:
        branch = fedcor_branch(args.fedcor)
        lock = [fedcor_lockstep(branch, fed, k, R, s, st) for s in range(1, 4)]
        f = frequencies(lambda s: fedcor_run(branch, fed, k, R, s, st), fed, k, R, S)
        figures["fedcor"] = {"lockstep": lock, "frequencies": f}
        print(f"FedCor federated_main.py: lockstep (fedsel's candidates handed to theirs, seeds 1-3 × {R} rounds): "
              + lockstep_line(lock))
        print(f"  frequencies over {S} seeds: " + frequency_line(f))
        for x in lock:
            for o in x["other_rounds"]:
                print("  differs:", o)
        failed |= ratio(f) > args.ratio or any(x["other"] for x in lock)
    if args.hics:
        module = load_server_poc(args.hics)
        lock = [hics_lockstep(module, fed, k, R, s, st) for s in range(1, 4)]
        f = frequencies(lambda s: hics_free(module, fed, k, R, s, stable=st), fed, k, R, S)
        f1 = frequencies(lambda s: hics_free(module, fed, k, R, s, stable=st), fed, k, R, S, first=1)
        fp = frequencies(lambda s: hics_free(module, fed, k, R, s, powd_round0=True, stable=st), fed, k, R, S, first=1)
        r0 = hics_round0(module, fed, k, args.round0_seeds)
        as_is = [hics_free(module, fed, k, R, s, as_is=True).picks for s in (1, 2)]
        same_as_is = sum(a == b for a, b in zip(*as_is))
        figures["hics"] = {"lockstep": lock, "frequencies": f, "frequencies_from_round_1": f1,
                           "frequencies_from_round_1_given_powd_round0": fp, "round0": r0,
                           "as_is_seed_1_2_same_rounds": same_as_is}
        print(f"HiCS-FL server_poc.py: lockstep (rounds 1-{R - 1}, seeds 1-3): " + lockstep_line(lock))
        print(f"  frequencies over {S} seeds (their np.random.seed(epoch) given [seed, epoch]): " + frequency_line(f))
        print(f"  the same, rounds 1-{R - 1} only: " + frequency_line(f1))
        print(f"  rounds 1-{R - 1}, their round 0 given fedsel's pow-d round 0: " + frequency_line(fp))
        print(f"  round 0 alone over {args.round0_seeds} seeds (fedsel pow-d, theirs K ∝ n_k): "
              f"{r0['tv_fedsel']:.4f} / {r0['tv_authors']:.4f} ({ratio(r0):.2f}×)")
        print(f"  as it is (np.random.seed(epoch)): runs 1 and 2 choose the same set in {same_as_is} of {R} rounds")
        for x in lock:
            for o in x["other_rounds"]:
                print("  differs:", o)
        failed |= ratio(f) > args.ratio or any(x["other"] for x in lock)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
