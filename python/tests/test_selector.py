"""`fedsel.Selector` on a tiny pure-Python problem, without the simulator.

Each client k holds a target vector mu_k; its loss at the global model w is
0.5 * |w - mu_k|^2, one local step moves w towards mu_k, and the model is a 3-class
output layer (bias 3 + weight 3x2 = 9 numbers), so the same vector serves strategies that
read full updates and those that read the output layer.
"""

import numpy as np
import pytest

import fedsel

N, CLASSES, DIM, M, ROUNDS = 12, 3, 9, 3, 12
SIZES = [20 + 5 * k for k in range(N)]


class Toy:
    """Answers every request a strategy can make, and records who each names."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.mu = rng.normal(size=(N, DIM))
        self.w = np.zeros(DIM)
        self.lr = 0.5
        self.asked = []

    def _note(self, clients):
        self.asked.append(list(clients))

    def loss(self, k, w=None):
        w = self.w if w is None else w
        return 0.5 * float(np.sum((w - self.mu[k]) ** 2))

    def trained(self, k):
        return self.w + self.lr * (self.mu[k] - self.w)

    def losses(self, clients):
        self._note(clients)
        return [self.loss(k) for k in clients]

    def minibatch_losses(self, clients):
        return self.losses(clients)

    def probe(self, clients, evaluate):
        self._note(list(clients) + list(evaluate))
        w = np.mean([self.trained(k) for k in clients], axis=0)
        return [self.loss(k, w) for k in evaluate]

    def updates(self, clients):
        self._note(clients)
        return np.array([self.trained(k) - self.w for k in clients], dtype=np.float32)

    def gradients(self, clients, scope):
        assert scope in ("full", "minibatch")
        self._note(clients)
        return [(self.w - self.mu[k]).tolist() for k in clients]

    def gram(self, clients):
        self._note(clients)
        f = self.mu[list(clients)]
        return (f @ f.T).tolist()


def play(sel, toy, seed=0, rounds=ROUNDS):
    """Runs `rounds` rounds of FL on `toy` with `sel`; returns the selections and, per
    round, the available clients."""
    rng = np.random.default_rng(seed)
    history = []
    for t in range(rounds):
        available = sorted(rng.choice(N, size=8, replace=False).tolist())
        toy.asked.clear()
        chosen = sel.select(t, available, M, toy)
        first_call = t == 0
        for named in toy.asked if not first_call else []:
            assert set(named) <= set(available), f"round {t}: asked about {named}, available {available}"
        assert set(chosen) <= set(available)
        assert 0 < len(chosen) <= M
        locals_ = np.array([toy.trained(k) for k in chosen])
        if sel.aggregation == "selector":
            w = np.array(sel.weights)
            assert len(w) == len(chosen)
            toy.w = toy.w + np.sum(w[:, None] * (locals_ - toy.w), axis=0)
        elif sel.aggregation == "data_size":
            s = np.array([SIZES[k] for k in chosen], dtype=float)
            toy.w = np.sum(s[:, None] * locals_, axis=0) / s.sum()
        else:
            toy.w = locals_.mean(axis=0)
        updates = None if sel.updates == "none" else (locals_ - toy.w).tolist()
        sel.observe(chosen, updates=updates, train_losses=[toy.loss(k) for k in chosen])
        history.append((available, chosen))
    return history


STRATEGIES = {
    "uniform": {},
    "md": {},
    "powd": {"d": 6},
    "afl": {},
    "fedcor": {"warmup": 3},
    "hics": {"entropy_report": False},
    "f3ast": {},
    "cs2": {},
    "divfl": {},
    "fedgs": {"graph": "sspp"},
    "oort": {},
    "fedcs": {"deadline_s": 3.0},
}


def make(strategy, seed=1, **extra):
    return fedsel.Selector(
        strategy,
        sizes=SIZES,
        per_round=M,
        rounds=ROUNDS,
        seed=seed,
        classes=CLASSES,
        **{**STRATEGIES[strategy], **extra},
    )


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_strategy_plays_a_toy_federation_reproducibly(strategy):
    first = play(make(strategy), Toy())
    again = play(make(strategy), Toy())
    assert first == again
    assert make(strategy).strategy == strategy


def test_powd_takes_the_highest_losses_among_its_candidates():
    toy = Toy()
    sel = make("powd", d=8)
    available = list(range(0, N, 1))[:8]
    chosen = sel.select(0, available, M, toy)
    losses = {k: toy.loss(k) for k in available}
    assert sorted(chosen) == sorted(sorted(available, key=losses.get)[-M:])


def test_f3ast_gives_its_own_aggregation_weights():
    sel = make("f3ast")
    assert sel.aggregation == "selector"
    chosen = sel.select(0, list(range(8)), M, Toy())
    assert len(sel.weights) == len(chosen) and all(w > 0 for w in sel.weights)
    assert make("uniform").weights is None


def test_state_round_trips_mid_run():
    toy_a, toy_b = Toy(), Toy()
    a = make("hics")
    play(a, toy_a, seed=3, rounds=5)
    b = make("hics")
    b.load_state(a.state())
    toy_b.w = toy_a.w.copy()
    rng = np.random.default_rng(9)
    for t in range(5, 10):
        available = sorted(rng.choice(N, size=8, replace=False).tolist())
        ca = a.select(t, available, M, toy_a)
        cb = b.select(t, available, M, toy_b)
        assert ca == cb
        u = [(toy_a.trained(k) - toy_a.w).tolist() for k in ca]
        a.observe(ca, updates=u)
        b.observe(cb, updates=u)
    assert a.state() == b.state()


def test_a_missing_query_method_is_named():
    class LossesOnly:
        def losses(self, clients):
            return [1.0] * len(clients)

    with pytest.raises(fedsel.FedselError, match="no method `gradients`"):
        make("divfl").select(0, list(range(8)), M, LossesOnly())
    with pytest.raises(fedsel.FedselError, match="no method `losses`"):
        make("powd").select(0, list(range(8)), M, object())


def test_a_query_exception_reaches_the_caller():
    class Broken:
        def losses(self, clients):
            raise ZeroDivisionError("client unreachable")

    with pytest.raises(ZeroDivisionError, match="client unreachable"):
        make("powd").select(0, list(range(8)), M, Broken())


def test_answers_of_the_wrong_length_are_refused():
    class Short:
        def losses(self, clients):
            return [1.0]

    with pytest.raises(fedsel.FedselError, match="1 values for 6 clients"):
        make("powd").select(0, list(range(8)), M, Short())


def test_an_unknown_client_or_option_is_an_error():
    with pytest.raises(fedsel.FedselError, match=r"`available\[1\]` is client 12, which is out of range"):
        make("uniform").select(0, [0, 12], M, Toy())
    with pytest.raises(fedsel.FedselError, match="dd"):
        make("powd", dd=3)
    with pytest.raises(fedsel.FedselError, match="takes no options"):
        fedsel.Selector("uniform", sizes=SIZES, per_round=M, rounds=ROUNDS, d=3)
    with pytest.raises(fedsel.FedselError, match="selection.strategy"):
        fedsel.Selector("nope", sizes=SIZES, per_round=M, rounds=ROUNDS)


def test_the_system_strategies_take_their_options_by_their_config_names():
    # Each reaches its own `[selection.<name>]` table: a known key is taken, a misspelt
    # one is refused naming the table, as in a config file.
    for strategy, good, bad in [
        ("tifl", {"protocol": "code", "T": 2}, "tiers"),
        ("refl", {"prohibit_reselect": 3}, "prohibit"),
        ("fedbalancer", {"fb_w": 5}, "fb_ww"),
    ]:
        sel = fedsel.Selector(strategy, sizes=SIZES, per_round=M, rounds=ROUNDS, **good)
        assert sel.strategy == strategy
        with pytest.raises(fedsel.FedselError, match=f"selection.{strategy}"):
            fedsel.Selector(strategy, sizes=SIZES, per_round=M, rounds=ROUNDS, **{bad: 1})


def test_updates_are_required_where_the_strategy_learns_from_them():
    sel = make("hics")
    assert sel.updates == "output_layer"
    chosen = sel.select(0, list(range(8)), M, Toy())
    with pytest.raises(fedsel.FedselError, match="pass `updates`"):
        sel.observe(chosen)
    with pytest.raises(fedsel.FedselError, match="observe before any select"):
        make("uniform").observe([0])


def test_oort_learns_measured_durations_and_refuses_impossible_ones():
    sel = make("oort", round_penalty=3.0)
    chosen = sel.select(0, list(range(N)), M, Toy())
    with pytest.raises(fedsel.FedselError, match="2 durations for 3 selected clients"):
        sel.observe(chosen, train_losses=[1.0] * M, durations=[1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="duration -1"):
        left_out = sel.observe(chosen, train_losses=[0.5] * M, durations=[4.0, -1.0, 2.5])
    assert left_out == [chosen[1]]
    state = sel.state()["selector"]
    assert [state["duration"][k] for k in chosen] == [4.0, None, 2.5]
    # U = n_k · |loss| for the clients that reported, n_k for the one left out.
    assert [state["reward"][k] for k in chosen] == [
        SIZES[chosen[0]] * 0.5, SIZES[chosen[1]], SIZES[chosen[2]] * 0.5
    ]


def test_fedcs_selects_the_measured_clients_that_fit_its_deadline():
    # Client k takes 1 + k % 5 s; the deadline is 3 s. Never-measured clients come first,
    # then the greedy takes the fastest that fit, ties by client id.
    sel = make("fedcs")
    everyone = list(range(N))
    seen, t = set(), 0
    while len(seen) < N:
        chosen = sel.select(t, everyone, M, Toy())
        sel.observe(chosen, train_losses=[1.0] * len(chosen),
                    durations=[1.0 + k % 5 for k in chosen])
        seen.update(chosen)
        t += 1
    fit = sorted((k for k in everyone if 1 + k % 5 <= 3), key=lambda k: (1 + k % 5, k))
    assert sel.select(t, everyone, N, Toy()) == fit
