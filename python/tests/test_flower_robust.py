"""A node whose reply is malformed or non-finite is dropped from the round; the run goes on.

Scripted-grid tests (see test_flower_strategy.py) corrupt one node's replies in every way
the strategy checks, for selectors that read the train replies' updates (HiCS-FL) and the
nodes' losses (Pow-d, FedCor); the simulation tests run the Flower example app with one
node replying NaN. Skipped where flwr is not installed.
"""

import json
import math

import numpy as np
import pytest

flwr = pytest.importorskip("flwr", reason="flwr is not installed")

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from test_flower import APP, flower_or_skip, run_app  # noqa: E402
from test_flower_strategy import NODES, ScriptedGrid, task_identity  # noqa: E402, F401 (autouse fixture)

from fedsel import FedselError  # noqa: E402
from fedsel.flower import FedselStrategy  # noqa: E402

# HiCS-FL (seed 3) trains this node in round 3, the last of its warm-up.
BAD = 104

NAN = float("nan")


def corrupt(fault: str, content: RecordDict, train: bool) -> RecordDict:
    """`content`, a good reply's, as a node with `fault` sends it."""
    metrics = MetricRecord(dict(content["metrics"]))
    arrays = [a.numpy().copy() for a in content["arrays"].values()] if train else []
    if fault == "nan":
        metrics["eval_loss"] = metrics["train_loss"] = NAN
        for a in arrays:
            a[...] = NAN
    elif fault == "inf_loss":
        metrics["eval_loss"] = metrics["train_loss"] = float("inf")
    elif fault == "inf_weight":
        metrics["eval_loss"] = NAN
        if arrays:
            arrays[0][0, :2] = -np.inf
    elif fault == "shape":
        del metrics["eval_loss"]
        if arrays:
            arrays[0] = np.zeros((4, 3), np.float32)
    elif fault == "int_arrays":
        metrics["eval_loss"] = [1.0, 2.0]
        arrays = [a.astype(np.int32) for a in arrays]
    elif fault == "no_metrics":
        return RecordDict({"arrays": ArrayRecord(arrays)} if train else {})
    elif fault == "no_arrays":
        metrics["eval_loss"] = []
        return RecordDict({"metrics": metrics})
    return RecordDict({"metrics": metrics, **({"arrays": ArrayRecord(arrays)} if train else {})})


# What the strategy says is wrong with each fault's train and loss replies.
REASONS = {
    "nan": ("array `0` has 12 non-finite values", "`eval_loss` is nan"),
    # A train reply's metrics are all checked, `eval_loss` first in that reply.
    "inf_loss": ("` is inf", "`eval_loss` is inf"),
    "inf_weight": ("array `0` has 2 non-finite values", "`eval_loss` is nan"),
    "shape": ("array `0` has shape (4, 3), not the model's (3, 4)", "no `eval_loss` metric"),
    "int_arrays": ("array `0` has dtype int32, not a float one", "`eval_loss` is list [1.0, 2.0], not a number"),
    "no_metrics": ("train reply: no metric record", "no metric record"),
    "no_arrays": ("no array record `arrays` (has [])", "`eval_loss` is list [], not a number"),
}


class Faulty(ScriptedGrid):
    """ScriptedGrid whose `bad` nodes, from round `from_round` on, send `fault`'s replies
    (to the requests of kind `only`, if given)."""

    def __init__(self, fault, bad=(BAD,), from_round=2, only=None):
        super().__init__()
        self.fault, self.bad, self.from_round, self.only = fault, set(bad), from_round, only

    def reply(self, message):
        reply = super().reply(message)
        kind = message.content.config_records["config"].get("fedsel", "train")
        if message.metadata.dst_node_id not in self.bad or self.round < self.from_round or self.only not in (None, kind):
            return reply
        train = message.metadata.message_type == "train"
        return Message(corrupt(self.fault, reply.content, train), reply_to=message)


def play(strategy, grid, rounds):
    """Flower's loop, as test_flower_strategy.run plays it; the selection and the global
    model after each round."""
    arrays = ArrayRecord([np.zeros((3, 4), np.float32), np.zeros(3, np.float32)])
    chosen, models = [], []
    for r in range(1, rounds + 1):
        grid.round = r
        messages = list(strategy.configure_train(r, arrays, ConfigRecord(), grid))
        chosen.append(sorted(m.metadata.dst_node_id for m in messages))
        new, _ = strategy.aggregate_train(r, [grid.reply(m) for m in messages])
        arrays = new if new is not None else arrays
        models.append([a.copy() for a in arrays.to_numpy_ndarrays()])
    return chosen, models


STRATEGIES = [("hics", {}), ("powd", {"d": 6}), ("fedcor", {"warmup": 1})]


def strategy(name, options):
    return FedselStrategy(name, per_round=2, num_rounds=5, seed=3, options=options, min_available_nodes=len(NODES))


@pytest.mark.parametrize("fault", sorted(REASONS))
@pytest.mark.parametrize(("name", "options"), STRATEGIES, ids=[s for s, _ in STRATEGIES])
def test_a_rejected_reply_is_dropped_as_a_failed_one_and_named(name, options, fault):
    """From round 2 on, node BAD replies with `fault`. Every round finishes with a finite
    model, and the run is the one where BAD's replies fail from round 2 on (selections and
    models alike): a rejected reply is a failed one, except that the round's record names it
    with what was wrong and the ledger books it under `rejected_replies`."""
    s = strategy(name, options)
    chosen, models = play(s, Faulty(fault), 5)
    dead = strategy(name, options)
    dead_chosen, dead_models = play(dead, ScriptedGrid(dead=BAD, dies_at=2), 5)
    assert chosen == dead_chosen
    assert all(np.array_equal(a, b) for m, d in zip(models, dead_models, strict=True) for a, b in zip(m, d, strict=True))
    assert all(np.isfinite(a).all() for m in models for a in m)
    train_reason, loss_reason = REASONS[fault]
    rejected = [h["rejected"] for h in s.history]
    assert rejected[0] == {} and any(rejected[1:]), rejected
    for h in s.history[1:]:
        assert set(h["rejected"]) <= {BAD}
        if BAD in h["rejected"]:
            reason = h["rejected"][BAD]
            assert (reason.startswith("train reply") and train_reason in reason) or (reason.startswith("loss reply") and loss_reason in reason), reason
        # Rejected in the selector's own requests: unavailable, and chosen without.
        assert (BAD in h["unanswered"]) == h["rejected"].get(BAD, "").startswith("loss reply")
        assert BAD not in h["failed"] and h["ledger"]["train_replies"] == len(set(h["selected"]) - set(h["rejected"]))
    assert s.ledger["rejected_replies"] == sum(len(r) for r in rejected) == dead.ledger["failed_replies"]
    assert s.ledger["failed_replies"] == 0
    sent = sum(v for k, v in s.ledger.items() if k.endswith("_messages"))
    answered = sum(v for k, v in s.ledger.items() if k.endswith("_replies"))
    assert sent == answered
    kinds = [r[BAD].split(" ")[0] if BAD in r else None for r in rejected[1:]]
    # HiCS-FL asks nothing, and trains BAD in round 3, its last warm-up round, and again in
    # round 4 (no update of BAD ever reached it); Pow-d asks every node for its loss in
    # every round; FedCor does so in its GP-training rounds (2 and 3), then chooses BAD.
    assert kinds == {"hics": [None, "train", "train", None], "powd": ["loss"] * 4, "fedcor": ["loss", "loss", "train", "train"]}[name]


def test_a_rejected_probe_training_makes_the_node_unavailable_for_the_round():
    """FedCor trains probe models on some nodes: a probe reply that is NaN cuts the
    selection short, and the round chooses what it would have had Flower not listed the
    node, from the selector's state before the round; BAD answers everything else."""
    options = {"warmup": 1, "interval": 1, "probes": 2}
    s = strategy("fedcor", options)
    chosen, models = play(s, Faulty("nan", only="probe_train"), 5)
    rounds = {r for r, h in enumerate(s.history, 1) if h["rejected"]}
    assert rounds and all(s.history[r - 1]["rejected"] == {BAD: "probe_train reply: array `0` has 12 non-finite values"} for r in rounds)
    assert all(s.history[r - 1]["unanswered"] == [BAD] for r in rounds)
    assert chosen == play(strategy("fedcor", options), ScriptedGrid(dead=BAD, dies_at=6, unlisted=rounds), 5)[0]
    assert all(np.isfinite(a).all() for m in models for a in m)


def test_fedgs_without_a_usable_update_of_every_node_is_an_error_naming_the_node():
    """FedGS_cos builds its graph from one local update of every node before round 1, so a
    node whose update is rejected leaves it nothing to choose with, as a node that dies
    then does: a FedselError naming the node, not a panic on a NaN graph."""
    s = strategy("fedgs", {"graph": "update"})
    with pytest.raises(FedselError, match=rf"round 1: update_train: nodes \[{BAD}\] gave no usable reply \(strategy fedgs\), and strategy fedgs cannot choose without them"):
        play(s, Faulty("inf_weight", from_round=1, only="update_train"), 1)
    assert s.history == [] and "array `0` has 2 non-finite values" in s._rejected[BAD]


def test_a_rejection_is_logged_once_naming_the_node_and_the_fault(caplog):
    s = strategy("hics", {})
    with caplog.at_level("WARNING", logger="flwr"):
        play(s, Faulty("nan", from_round=1), 3)
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert lines == [f"node {BAD}: train reply rejected: array `0` has 12 non-finite values"]


def test_a_round_whose_every_reply_is_rejected_keeps_the_model_and_the_run_goes_on():
    s = strategy("hics", {})
    chosen, models = play(s, Faulty("nan", bad=NODES), 3)
    first = models[0]
    assert all(len(c) == 2 for c in chosen)
    assert [np.array_equal(a, b) for m in models[1:] for a, b in zip(m, first)] == [True] * 4
    assert [len(h["rejected"]) for h in s.history] == [0, 2, 2]
    assert s.ledger["rejected_replies"] == 4 and s.ledger["train_replies"] == 2


@pytest.mark.parametrize(("examples", "why"), [(0, "`num-examples` is 0, not a whole number"), (2.5, "`num-examples` is 2.5"), (NAN, "`num-examples` is nan")])
def test_a_node_whose_size_reply_is_rejected_is_not_of_the_federation(examples, why):
    class BadSize(ScriptedGrid):
        def reply(self, message):
            reply = super().reply(message)
            if message.metadata.dst_node_id == BAD and message.content.config_records["config"].get("fedsel") == "size":
                return Message(RecordDict({"metrics": MetricRecord({"num-examples": examples})}), reply_to=message)
            return reply

    s = strategy("powd", {"d": 6})
    play(s, BadSize(), 2)
    assert s.nodes == [n for n in NODES if n != BAD]
    assert why in s.history[0]["rejected"][BAD] and s.ledger["size_replies"] == len(NODES) - 1


def test_an_aggregate_that_overflows_is_not_taken():
    """Finite local models can still sum past the model's dtype when the weights are not
    renormalised (F3AST's p_k / r_k): the round keeps the model it had, and the selector is
    not told. A weight of 2 stands in for a large p_k / r_k."""
    s = FedselStrategy("f3ast", per_round=2, num_rounds=3, min_available_nodes=len(NODES))
    grid = ScriptedGrid()
    arrays = ArrayRecord([np.zeros((3, 4), np.float32), np.zeros(3, np.float32)])
    messages = list(s.configure_train(1, arrays, ConfigRecord(), grid))
    s._weights = [2.0, 2.0]
    big = [np.full((3, 4), 2e38, np.float32), np.zeros(3, np.float32)]
    replies = [Message(RecordDict({"arrays": ArrayRecord(big), "metrics": MetricRecord({"train_loss": 1.0, "num-examples": 10})}), reply_to=m) for m in messages]
    new, metrics = s.aggregate_train(1, replies)
    assert new is None and metrics["train_loss"] == 1.0
    assert s.ledger["rejected_aggregates"] == 1 and s.history[0]["aggregate_rejected"] == "`0` 12"
    # The run goes on from the same model.
    grid.round = 2
    assert len(list(s.configure_train(2, arrays, ConfigRecord(), grid))) == 2


def test_train_metrics_that_disagree_between_replies_leave_the_metrics_out_not_the_model():
    """Each reply is checked alone; that one carries a metric the others lack blames no node."""
    s = strategy("hics", {})
    grid = ScriptedGrid()
    arrays = ArrayRecord([np.zeros((3, 4), np.float32), np.zeros(3, np.float32)])
    messages = list(s.configure_train(1, arrays, ConfigRecord(), grid))
    replies = [grid.reply(m) for m in messages]
    replies[0].content["metrics"]["train_acc"] = 0.5
    new, metrics = s.aggregate_train(1, replies)
    assert new is not None and metrics is None and s.history[0]["rejected"] == {}


@pytest.mark.parametrize(("strategy_name", "options", "fault", "rounds"), [("hics", "", "nan", 3), ("powd", '{"d": 4}', "nan", 2), ("powd", '{"d": 4}', "malformed", 2)])
def test_a_simulation_with_a_faulty_node_finishes_every_round(tmp_path, strategy_name, options, fault, rounds):
    """The issue's acceptance: the example app with one node replying NaN (or malformed
    replies) on the simulation engine. HiCS-FL trains every node in its first 2 rounds,
    so the bad node's train reply is rejected at least once and round 3 clusters the
    others' updates; Pow-d (d = 4) asks every node for its loss, so the bad node's loss reply is
    rejected in every round and it is never chosen."""
    bin_dir = flower_or_skip()
    results = tmp_path / "results.json"
    run_config = (
        f'strategy="{strategy_name}" num-server-rounds={rounds} clients=4 per-round=2 local-steps=5 '
        f'test-examples=500 results="{results}" faulty-node=1 fault="{fault}"'
    )
    if options:
        run_config += f" options='{options}'"
    log = run_app(tmp_path, bin_dir, APP, run_config, nodes=4, label=f"{strategy_name} {fault}")
    assert results.is_file(), log
    out = json.loads(results.read_text())
    assert out["done"] == rounds, log
    acc = [out["test_acc"][str(r)] for r in range(rounds + 1)]
    loss = [out["test_loss"][str(r)] for r in range(rounds + 1)]
    print(f"test accuracy by round: {acc}, loss: {loss}; rejected: {[h['rejected'] for h in out['history']]}")
    assert all(math.isfinite(x) for x in loss), loss
    # A NaN model predicts class 0 everywhere, as the initial one does (0.11 of these 500
    # images); a round trains on 2 nodes of 2 classes each.
    assert acc[-1] > 0.15, acc
    rejected = [h["rejected"] for h in out["history"]]
    bad = {n for r in rejected for n in r}
    assert len(bad) == 1, rejected
    (node,) = bad
    assert out["ledger"]["rejected_replies"] == sum(len(r) for r in rejected)
    if strategy_name == "hics":
        assert all(r[node].startswith("train reply") and "non-finite values" in r[node] for r in rejected if r), rejected
    else:
        assert all(int(node) in h["unanswered"] and int(node) not in h["selected"] for h in out["history"])
        assert all("eval_loss" in r[node] for r in rejected)
    for h in out["history"]:
        assert len(h["selected"]) == 2 and h["ledger"]["train_replies"] == 2 - (node in h["rejected"] and int(node) in h["selected"])
