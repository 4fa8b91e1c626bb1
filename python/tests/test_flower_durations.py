"""FedselStrategy measures each train reply's round trip and hands it to the selector.

A scripted grid stamps its replies with chosen round trips, which the selector must receive
exactly; a Flower simulation of the example app with artificially slow nodes checks that the
measured round trips tell the slow nodes apart and that Oort then prefers the fast ones.
Skipped where flwr is not installed.
"""

import json
import math

import pytest

flwr = pytest.importorskip("flwr", reason="flwr is not installed")

import numpy as np  # noqa: E402
from flwr.app import Error, Message, RecordDict  # noqa: E402
from test_flower import APP, flower_or_skip, run_app  # noqa: E402
from test_flower_robust import play  # noqa: E402
from test_flower_strategy import NODES, ScriptedGrid, task_identity  # noqa: E402, F401 (autouse fixture)

from fedsel.flower import FedselStrategy, _Rejected  # noqa: E402

# Seconds per round: multiples of 2^-2, so that a stamp of ~1.7e9 s plus one is exact and
# the difference the strategy takes gives it back to the bit.
BASE = {101: 0.5, 102: 4.0, 103: 1.0, 104: 2.0, 105: 0.25, 106: 8.0}


def seconds(node, round_):
    return BASE[node] * round_


class Timed(ScriptedGrid):
    """ScriptedGrid whose train replies are stamped `seconds(node, round)` after their
    message, except that node `bad`'s reply in round `bad_round` carries the stamp `stamp`
    (a function of its message's), or is an error where `stamp` is None."""

    def __init__(self, bad=None, bad_round=None, stamp=None, **kw):
        super().__init__(**kw)
        self.bad, self.bad_round, self.stamp = bad, bad_round, stamp

    def reply(self, message):
        reply = super().reply(message)
        node = message.metadata.dst_node_id
        if message.metadata.message_type == "train" and not reply.has_error():
            sent = message.metadata.created_at
            if node != self.bad or self.round != self.bad_round:
                reply.metadata.created_at = sent + seconds(node, self.round)
            elif self.stamp is None:
                return Message(Error(code=0, reason="node gone"), reply_to=message)
            else:
                reply.metadata.created_at = self.stamp(sent)
        return reply


class Spied(FedselStrategy):
    """A FedselStrategy that logs, per observe call, the nodes reported and their durations."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.observed: list[tuple[list[int], list[float] | None]] = []

    def _new_selector(self, arrays):
        return _Spy(super()._new_selector(arrays), self)


class _Spy:
    """The selector, whose observe calls are logged on the strategy."""

    def __init__(self, inner, strategy):
        self.inner, self.strategy = inner, strategy

    def observe(self, selected, **kw):
        self.strategy.observed.append(([self.strategy.nodes[k] for k in selected], kw.get("durations")))
        return self.inner.observe(selected, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def spied(name="oort", options=None):
    return Spied(name, per_round=2, num_rounds=5, seed=3, options=options or {}, min_available_nodes=len(NODES))


@pytest.mark.parametrize("name", ["oort", "uniform", "hics"])
def test_the_selector_receives_each_reported_nodes_round_trip_in_order(name):
    s = spied(name)
    play(s, Timed(), 5)
    assert len(s.observed) == 5
    for r, (nodes, durations) in enumerate(s.observed, 1):
        assert nodes == s.history[r - 1]["selected"]
        assert durations == [seconds(n, r) for n in nodes]
        assert s.history[r - 1]["durations"] == {n: seconds(n, r) for n in sorted(nodes)}


def test_oort_keeps_the_last_round_trip_of_each_node():
    """Oort's state holds each node's last measured duration, by the selector's index of
    the node; a node never trained has none."""
    s = spied()
    play(s, Timed(), 5)
    last = {}
    for r, h in enumerate(s.history, 1):
        last.update({n: seconds(n, r) for n in h["selected"]})
    assert s.selector.state()["selector"]["duration"] == [last.get(n) for n in s.nodes]


STAMPS = [
    (lambda sent: sent - 1.0, "train reply: its round trip is -1.0 s"),
    (lambda sent: math.nan, "train reply: `created_at` is nan"),
    (lambda sent: math.inf, "train reply: `created_at` is inf"),
]


@pytest.mark.parametrize(("stamp", "why"), STAMPS, ids=["negative", "nan", "inf"])
def test_a_reply_whose_round_trip_is_not_a_duration_is_rejected_as_a_failed_one(stamp, why):
    """A reply stamped before its message (a node's clock far behind, or a forged stamp) or
    not stamped with a number is booked and named like any rejected reply, left out of the
    aggregate and of what the selector learns, as if it had failed: Oort then chooses as it
    does when that reply fails (selections, models and what it learns, round by round)."""
    clean = spied()
    play(clean, Timed(), 3)
    bad = clean.history[2]["selected"][0]
    s = spied()
    chosen, models = play(s, Timed(bad=bad, bad_round=3, stamp=stamp), 5)
    h = s.history[2]
    assert list(h["rejected"]) == [bad] and h["rejected"][bad].startswith(why), h["rejected"]
    assert bad not in h["durations"] and bad not in h["failed"]
    assert s.observed[2][0] == [n for n in h["selected"] if n != bad]
    assert s.ledger["rejected_replies"] == 1
    failed = spied()
    failed_chosen, failed_models = play(failed, Timed(bad=bad, bad_round=3), 5)
    assert failed.history[2]["failed"] == [bad] and bad not in failed.history[2]["durations"]
    assert chosen == failed_chosen and s.observed == failed.observed
    assert all(np.array_equal(a, b) for m, f in zip(models, failed_models, strict=True) for a, b in zip(m, f, strict=True))


def test_a_reply_from_a_node_sent_no_train_message_has_no_round_trip():
    s = spied()
    play(s, Timed(), 1)
    stranger = next(n for n in NODES if n not in s.history[0]["selected"])
    reply = Message(RecordDict(), reply_to=Message(RecordDict(), dst_node_id=stranger, message_type="train"))
    with pytest.raises(_Rejected, match="no train message was sent to it this round"):
        s.round_trip(reply)


# The simulation: 4 nodes, 2 per round; the nodes of partitions 0 and 1 sleep SLOW seconds
# in every training. Oort explores one new node per round (its exploration share is
# ⌊2·0.88⌋ = 1) until all four have trained, by round 3, then exploits.
SLOW, ROUNDS = 2.0, 6


def test_oort_on_flower_measures_slow_nodes_and_prefers_fast_ones(tmp_path):
    bin_dir = flower_or_skip()
    results = tmp_path / "results.json"
    run_config = (
        f'strategy="oort" num-server-rounds={ROUNDS} clients=4 per-round=2 local-steps=5 '
        f'test-examples=500 slow-nodes="0,1" slow-delay={SLOW} results="{results}"'
    )
    # Two ClientApp workers, one per node of a round, so that no node's round trip
    # includes a wait for another's training.
    log = run_app(tmp_path, bin_dir, APP, run_config, nodes=4, label="oort slow nodes", federation="client-resources-num-cpus=1 init-args-num-cpus=2")
    out = json.loads(results.read_text())
    assert out["done"] == ROUNDS, log
    history = out["history"]
    measured: dict[str, list[float]] = {}
    for h in history:
        assert sorted(h["durations"]) == sorted(str(n) for n in h["selected"]), h
        for n, d in h["durations"].items():
            measured.setdefault(n, []).append(d)
    assert len(measured) == 4, measured
    # A slow node's round trip holds its sleep; a fast node's must stay below it.
    slow = {n for n, ds in measured.items() if min(ds) >= SLOW}
    fast = {n for n, ds in measured.items() if max(ds) < SLOW}
    assert len(slow) == 2 and len(fast) == 2, measured
    print(f"round trips: slow {sorted(d for n in slow for d in measured[n])}, fast {sorted(d for n in fast for d in measured[n])}")
    explored = next(r for r in range(1, ROUNDS + 1) if len({str(n) for h in history[:r] for n in h["selected"]}) == 4)
    picks = [str(n) for h in history[explored:] for n in h["selected"]]
    print(f"all nodes tried by round {explored}; picks after: {sum(n in fast for n in picks)} fast, {sum(n in slow for n in picks)} slow")
    assert picks and sum(n in fast for n in picks) > sum(n in slow for n in picks), (picks, measured)
