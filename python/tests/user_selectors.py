"""Selectors written in Python, as a user writes them, for the tests of `py:` strategies
(fedsel's own `uniform` and `powd` in Python are in `fedsel.selectors`)."""

from fedsel.selectors import Uniform



class LossGreedy:
    """Keeps each client's last training loss; picks the highest half of the budget and
    fills the rest at random (a stateful selector, for resume)."""

    needs = ["losses"]

    def __init__(self, explore=0.5):
        self.explore = explore
        self.loss = {}
        self.seen_rounds = []

    def select(self, ctx):
        k = min(ctx.budget, len(ctx.available))
        known = sorted((c for c in ctx.available.tolist() if c in self.loss), key=lambda c: -self.loss[c])
        greedy = known[: int(k * (1 - self.explore))]
        rest = [c for c in ctx.available.tolist() if c not in greedy]
        return greedy + ctx.rng.sample(rest, k - len(greedy))

    def observe(self, feedback):
        self.seen_rounds.append(feedback.round)
        for c, l in zip(feedback.clients.tolist(), feedback.train_losses.tolist()):
            self.loss[c] = l

    def state(self):
        return {"loss": {str(c): l for c, l in self.loss.items()}}

    def load_state(self, state):
        self.loss = {int(c): l for c, l in state["loss"].items()}


class Stateless:
    """Chooses at random from NumPy, and keeps no state: runs, but cannot resume."""

    def select(self, ctx):
        g = ctx.rng.numpy()
        return g.choice(ctx.available, size=min(ctx.budget, len(ctx.available)), replace=False).tolist()


class Returns:
    """Returns, from round `at` on, what `bad` makes of the context."""

    def __init__(self, bad, at=3):
        self.bad, self.at = bad, at

    def select(self, ctx):
        if ctx.round >= self.at:
            return BAD[self.bad](ctx)
        return ctx.rng.sample(ctx.available, min(ctx.budget, len(ctx.available)))


BAD = {
    "duplicate": lambda ctx: [int(ctx.available[0])] * 2,
    "unavailable": lambda ctx: [next(c for c in range(len(ctx.sizes)) if c not in set(ctx.available.tolist()))],
    "out_of_range": lambda ctx: [len(ctx.sizes) + 5],
    "too_many": lambda ctx: ctx.available[: ctx.budget + 1].tolist(),
    "float": lambda ctx: [float(ctx.available[0])],
    "none": lambda ctx: None,
    "raises": lambda ctx: {}["no such key"],
}


class Timed:
    """Remembers the clock and the registered durations it was shown."""

    def __init__(self):
        self.clock = []

    def select(self, ctx):
        self.clock.append((ctx.round, ctx.clock_s, ctx.durations is not None))
        return ctx.rng.sample(ctx.available, min(ctx.budget, len(ctx.available)))


