"""FedCor's GP beside the authors' `src/GPR.py` (github.com/Yoruko-Tang/FedCor), on identical inputs.

Both sides start from the same embeddings X (fedsel draws them; they are loaded into the
authors' `Kernel_GPR` with `Set_Parameters`), see the same loss stream (losses on a 2^-20 grid,
so every loss change is exact in float32, the dtype the authors' `Update_Training_Data`
stores) and train with the same Adam settings (lr 1e-2, 150 steps per warm-up fit, 100 per
GP-training fit, fresh moments per fit), noise σ_n = 0.01, discount γ = θ, linear kernel
(Poly order 1, unnormalised) and MML objective. The authors' module is imported unchanged
from the checkout; the driver only sets torch's default dtype to float64 and casts the stored
samples to float64 (no value changes), so the comparison is of the algorithm, not of float32.

What is compared, as max |fedsel − authors| / max |authors| over the entries:
  1. warm-up: X and Σ after each of the R_w + 1 warm-up fits, the authors' fit restarted from
     fedsel's X before it (fedsel fits every warm-up round on the last 11 samples with
     weights θ^age, as the authors' code does without --update_mean), beside the authors'
     own fit from that X perturbed by 1e-13, which measures how much Adam amplifies rounding;
  2. the prior covariance Σ = XᵀX + σ_n² I and, through the authors' `Posteriori`, the
     posterior mean and covariance given the next round's loss changes of m clients;
  3. the greedy selections of the rounds after warm-up (with the annealing α ← βα);
  4. the first GP-training fit after warm-up, on Eq. 17's window (this round's sample and
     the one Δt rounds earlier, weights 1 and θ^Δt) given to both sides;
and, as measured effects of the places where fedsel follows the paper rather than the
authors' current code (not expected to agree):
  5. the authors' v2 window on that GP-training round (every sample kept for `group_size`
     rounds, each weighted γ^age) instead of Eq. 17's;
  6. the README's --update_mean warm-up (prior mean = discounted mean of the loss changes,
     one 1000-step fit at the end of warm-up) instead of μ = 0 and a fit every round;
  7. the authors' native float32 on the warm-up fits;
  8. the whole warm-up chained (fedsel against the authors, and the authors against
     themselves from X₀ perturbed by 1e-13), which shows why only fit-by-fit figures mean much.

Usage: python scripts/reference/fedcor_gpr.py --checkout /path/to/FedCor
(fedsel importable, e.g. PYTHONPATH=python after `pip install ./python` or a maturin build).
"""

import argparse
import json
import sys

import numpy as np


def rel(a, b):
    """Largest entry-wise difference, relative to the largest entry of the reference."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


class Stream:
    """Held-out losses of every client, round by round, with correlated loss changes.

    Clients belong to a few latent groups; a group's clients move together, which is the
    structure FedCor's GP is meant to learn. Losses are rounded to a 2^-20 grid so that the
    changes are exact in float32.
    """

    def __init__(self, n, rounds, seed):
        rng = np.random.default_rng(seed)
        groups = rng.integers(0, 4, size=n)
        level = 2.3 + 0.1 * rng.standard_normal(n)
        self.losses = [level]
        for _ in range(rounds + 1):
            common = -0.05 * (1.0 + rng.standard_normal(4))[groups]
            step = common + 0.01 * rng.standard_normal(n)
            self.losses.append(self.losses[-1] + step)
        self.losses = [np.round(l * 2**20) / 2**20 for l in self.losses]
        self.probe = [np.round((l - 0.03 + 0.02 * rng.standard_normal(n)) * 2**20) / 2**20
                      for l in self.losses]


class Query:
    """What fedsel's FedCor asks for: held-out losses now, and a probe model's losses."""

    def __init__(self, stream):
        self.stream = stream
        self.round = 0

    def losses(self, clients):
        return [float(self.stream.losses[self.round][k]) for k in clients]

    def probe(self, clients, evaluate):
        return [float(self.stream.probe[self.round][k]) for k in evaluate]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", required=True, help="a checkout of Yoruko-Tang/FedCor")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5, help="R_w (the README uses 15)")
    ap.add_argument("--interval", type=int, default=4, help="Δt (the README uses 10)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    import torch

    sys.path.insert(0, f"{args.checkout}/src")
    import GPR  # the authors' module, unchanged
    import fedsel

    torch.set_default_dtype(torch.float64)
    torch.distributions.Distribution.set_default_validate_args(False)
    n, m, rw, dt = args.clients, args.per_round, args.warmup, args.interval
    if (rw + 1) % dt == 0:
        sys.exit("choose --warmup and --interval so that round R_w + 1 is not a GP-training round")
    d, noise, theta, beta, lr = 15, 0.01, 0.9, 0.95, 0.01
    history_warmup, warm_steps, gp_steps = 10, 150, 100
    gp_round = next(t for t in range(rw + 1, rw + 1 + dt) if t % dt == 0)
    rounds = gp_round + 2
    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(50, 400, size=n)
    p = sizes / sizes.sum()
    stream = Stream(n, rounds, args.seed)
    query = Query(stream)

    sel = fedsel.Selector(
        "fedcor", sizes=sizes.tolist(), per_round=m, rounds=rounds, seed=args.seed,
        dim=d, noise=noise, warmup=rw, interval=dt, beta=beta, theta=theta,
        history_warmup=history_warmup, history=1, probes=1, steps=gp_steps,
        warmup_steps=warm_steps, lr=lr,
    )
    everyone = list(range(n))

    def fedsel_x():
        s = sel.state()["selector"]
        return np.asarray(s["x"], dtype=np.float64).reshape(n, s["d"]).T  # column-major d×N

    def play(t):
        query.round = t
        chosen = sel.select(t, available=everyone, budget=m, query=query)
        sel.observe(chosen, train_losses=[0.0] * len(chosen))
        return chosen

    def authors_gpr(x, dtype=torch.float64, gamma=theta, history=history_warmup):
        g = GPR.Kernel_GPR(n, loss_type="MML", init_noise=noise,
                           reusable_history_length=history, gamma=gamma, dimension=d,
                           kernel=GPR.Poly_Kernel, order=1, Normalize=False)
        g.Set_Parameters(proj=torch.tensor(x, dtype=dtype))
        g.noise = torch.tensor(noise, dtype=dtype)
        g.mu = torch.zeros(n, dtype=dtype)
        g.discount = torch.ones(n, dtype=dtype)
        return g

    def add_sample(g, epoch, dl, dtype=torch.float64):
        g.Update_Training_Data([np.arange(n)], [np.asarray(dl)], epoch=epoch)
        g.data = {e: v.to(dtype) for e, v in g.data.items()}

    def cov(x):
        """Σ = XᵀX + σ_n² I, what both codes select from."""
        x = np.asarray(x, dtype=np.float64)
        return x.T @ x + noise**2 * np.eye(n)

    def change(t):
        return stream.losses[t + 1] - stream.losses[t]

    figures, effects = {}, {}
    play(0)
    x0 = fedsel_x()
    # `ref` restarts every warm-up fit from fedsel's X before that fit, so each figure is one
    # fit's difference; `chain`, `nudged` and `chain32` run the authors' code on their own
    # from X0 (X0 · (1 + 1e-13 z) for `nudged`) to measure how the fits amplify differences.
    ref, ref32 = authors_gpr(x0), authors_gpr(x0, dtype=torch.float32)
    chain, chain32 = authors_gpr(x0), authors_gpr(x0, dtype=torch.float32)
    nudged = authors_gpr(x0 * (1.0 + 1e-13 * rng.standard_normal(x0.shape)))
    # `ref_nudged` is `ref` restarted from fedsel's X · (1 + 1e-13 z): one fit's own sensitivity.
    ref_nudged = authors_gpr(x0)
    warm_x, warm_s, warm_x32, warm_nudged = [], [], [], []
    x_prev = x0
    for t in range(rw + 1):
        for g, dtype in ((ref, torch.float64), (ref32, torch.float32), (chain, torch.float64),
                         (chain32, torch.float32), (nudged, torch.float64),
                         (ref_nudged, torch.float64)):
            add_sample(g, t, change(t), dtype)
        ref.Set_Parameters(proj=torch.tensor(x_prev))
        ref32.Set_Parameters(proj=torch.tensor(x_prev, dtype=torch.float32))
        ref_nudged.Set_Parameters(
            proj=torch.tensor(x_prev * (1.0 + 1e-13 * rng.standard_normal(x_prev.shape))))
        for g in (ref, ref32, chain, chain32, nudged, ref_nudged):
            g.Train(lr=lr, llr=0.01, max_epoches=warm_steps, update_mean=False, verbose=False)
        # select(t + 1) closes sample t and fits; select(R_w + 1) then selects by the GP.
        if t < rw:
            play(t + 1)
        else:
            query.round = rw + 1
            first = sel.select(rw + 1, available=everyone, budget=m, query=query)
        x_prev = fedsel_x()
        x_ref = ref.Projection.PMatrix.detach().numpy()
        warm_x.append(rel(x_prev, x_ref))
        warm_s.append(rel(cov(x_prev), cov(x_ref)))
        warm_nudged.append(rel(cov(ref_nudged.Projection.PMatrix.detach().numpy()), cov(x_ref)))
        warm_x32.append(rel(ref32.Projection.PMatrix.detach().numpy(), x_ref))
    x_warm = x_prev
    figures["warmup_embeddings_X_per_fit"] = max(warm_x)
    figures["warmup_covariance_per_fit"] = max(warm_s)
    print("warm-up fits, Σ: fedsel vs authors   ", " ".join(f"{v:.1e}" for v in warm_s))
    print("warm-up fits, Σ: authors X·(1+1e-13z)", " ".join(f"{v:.1e}" for v in warm_nudged))
    x_chain = chain.Projection.PMatrix.detach().numpy()
    effects["authors_one_fit_X_nudged_1e-13_covariance"] = max(warm_nudged)
    effects["authors_vs_authors_X0_nudged_1e-13_covariance"] = rel(
        cov(nudged.Projection.PMatrix.detach().numpy()), cov(x_chain))
    effects["fedsel_vs_authors_whole_warmup_covariance"] = rel(cov(x_warm), cov(x_chain))
    effects["float32_one_fit_X"] = max(warm_x32)
    effects["float32_whole_warmup_covariance"] = rel(cov(chain32.Projection.PMatrix.detach().numpy()), cov(x_chain))

    sigma_f = cov(x_warm)
    sigma_a = ref.Covariance().detach().numpy()
    figures["prior_covariance"] = rel(sigma_f, sigma_a)
    observed = np.asarray(first)
    data = np.stack([observed, change(rw + 1)[observed]], axis=1)
    twin = authors_gpr(x_warm)
    mu_f, post_f = twin.Posteriori(data)
    mu_a, post_a = ref.Posteriori(data)
    figures["posterior_mean"] = rel(mu_f.numpy(), mu_a.numpy())
    figures["posterior_covariance"] = rel(post_f.numpy(), post_a.numpy())

    # Greedy selections until the GP-training round, α annealed as both codes do.
    picks_f, picks_a = [list(first)], [ref.Select_Clients(m, 0.0, p)]
    sel.observe(first, train_losses=[0.0] * m)
    ref.Update_Discount(picks_a[-1], beta)
    for t in range(rw + 2, gp_round):
        picks_f.append(list(play(t)))
        picks_a.append(ref.Select_Clients(m, 0.0, p))
        ref.Update_Discount(picks_a[-1], beta)
    figures["greedy_selections_equal"] = f"{sum(a == b for a, b in zip(picks_f, picks_a))}/{len(picks_f)}"

    # The GP-training round: fedsel probes, resets α, fits Eq. 17's window, then selects.
    x_before = fedsel_x()
    picks_f.append(list(play(gp_round)))
    x_gp = fedsel_x()
    dl_gp = stream.probe[gp_round] - stream.losses[gp_round]
    window = authors_gpr(x_before)
    add_sample(window, gp_round - dt, change(gp_round - dt))
    add_sample(window, gp_round, dl_gp)
    window.Train(lr=lr, llr=0.01, max_epoches=gp_steps, update_mean=False, verbose=False)
    figures["gp_round_embeddings_X_eq17_window"] = rel(x_gp, window.Projection.PMatrix.detach().numpy())
    window.Reset_Discount()
    gp_pick = window.Select_Clients(m, 0.0, p)
    figures["gp_round_selection_equal"] = picks_f[-1] == gp_pick

    # Effects of the deliberate departures (README v2 settings, not expected to agree).
    v2 = authors_gpr(x_before, history=100)
    for t in range(rw + 1):
        add_sample(v2, t, change(t))
    add_sample(v2, gp_round, dl_gp)
    v2.Train(lr=lr, llr=0.01, max_epoches=gp_steps, update_mean=False, verbose=False)
    sigma_gp = cov(x_gp)
    effects["v2_window_covariance"] = rel(sigma_gp, v2.Covariance().detach().numpy())
    v2.Reset_Discount()
    effects["v2_window_selection_overlap"] = len(set(v2.Select_Clients(m, 0.0, p)) & set(gp_pick)) / m
    mean = authors_gpr(x0)
    for t in range(rw + 1):
        add_sample(mean, t, change(t))
    mean.Train(lr=lr, llr=0.01, max_epoches=1000, update_mean=True, verbose=False)
    effects["update_mean_covariance"] = rel(chain.Covariance().detach().numpy(), mean.Covariance().detach().numpy())
    effects["update_mean_prior_mean_max_abs"] = float(mean.mu.abs().max())
    effects["update_mean_selection_overlap"] = len(set(mean.Select_Clients(m, 0.0, p)) & set(picks_a[0])) / m

    print(f"FedCor GP, {n} clients, d = {d}, R_w = {rw}, Δt = {dt}, m = {m}, seed {args.seed}")
    print("compared (max |fedsel − authors| / max |authors|):")
    for k, v in figures.items():
        print(f"  {k:40s} {v:.3e}" if isinstance(v, float) else f"  {k:40s} {v}")
    print("measured effects of the departures (authors' variant vs fedsel):")
    for k, v in effects.items():
        print(f"  {k:40s} {v:.3e}" if isinstance(v, float) else f"  {k:40s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"compared": figures, "effects": effects}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
