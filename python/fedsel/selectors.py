"""fedsel's own `uniform` and `powd`, written as a user writes a selector
(docs/your-selector.md): templates to start from, and the subjects of the tests that a
Python selector drawing through ``ctx.rng`` and asking through ``ctx.query`` gives the
built-in strategy's run bit for bit (``python/tests/test_user_selector.py``).

Named in a config as ``py:fedsel.selectors:Uniform`` and ``py:fedsel.selectors:PowD``.
"""

from __future__ import annotations

from typing import Any


class Uniform:
    """min(K_t, |A_t|) available clients, uniformly without replacement: the built-in
    `uniform` (Rand in FedCor, UniformSample in FedGS)."""

    def select(self, ctx: Any) -> list[int]:
        return ctx.rng.sample(ctx.available, min(ctx.budget, len(ctx.available)))

    def state(self) -> None:
        return None

    def load_state(self, state: None) -> None:
        pass


class PowD:
    """Power-of-choice (Cho, Wang and Joshi, AISTATS 2022), the built-in `powd` with the
    same keys and defaults (`d = 10`, or `d_per_m · K_t` when `d_per_m` > 0; 0 = every
    available client): d candidates drawn ∝ p_k without replacement, then the K_t of
    highest held-out loss among them (ties kept in draw order)."""

    def __init__(self, d: int = 10, d_per_m: int = 0):
        self.d, self.d_per_m = d, d_per_m

    def select(self, ctx: Any) -> list[int]:
        avail = ctx.available
        d = self.d_per_m * ctx.budget if self.d_per_m > 0 else (self.d or len(avail))
        candidates = ctx.rng.weighted_sample(avail, ctx.weights[avail], min(d, len(avail)))
        losses = ctx.query.losses(candidates)
        order = sorted(range(len(candidates)), key=lambda i: -losses[i])
        return [candidates[i] for i in order[: min(ctx.budget, len(candidates))]]

    def state(self) -> None:
        return None

    def load_state(self, state: None) -> None:
        pass
