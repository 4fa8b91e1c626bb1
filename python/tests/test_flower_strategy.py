"""FedselStrategy driven round by round against a scripted Flower grid.

The grid answers the strategy's messages itself (no SuperLink, no simulation engine), so
these tests can make a node fall silent at a chosen round, as a node that dies in a
deployment does until Flower stops listing it. Skipped where flwr is not installed.
"""

import numpy as np
import pytest

flwr = pytest.importorskip("flwr", reason="flwr is not installed")

from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedsel import FedselError  # noqa: E402
from fedsel.flower import FedselStrategy, output_layer  # noqa: E402

NODES = [101, 102, 103, 104, 105, 106]
DEAD = 104


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Messages can only be made inside a Flower task; these tests play the ServerApp's."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)


class ScriptedGrid:
    """Every node answers at once, with losses and updates that depend on the node, the
    round and the model, except `dead`: from round `dies_at` on it answers with an error
    (the SuperLink giving up on it) while still listed as connected, except in the rounds
    `unlisted`, where Flower no longer lists it."""

    def __init__(self, dead=None, dies_at=2, unlisted=(), dies_on=None):
        self.dead, self.dies_at, self.unlisted = dead, dies_at, set(unlisted)
        # With `dies_on`, the node dies on receiving its first message of that kind from
        # round `dies_at` on, after answering the round's earlier requests.
        self.dies_on, self.gone = dies_on, dies_on is None
        self.round = 1
        self.asked: list[tuple[int, str, int]] = []

    def silent(self, node):
        return node == self.dead and self.round >= self.dies_at and self.gone

    def get_node_ids(self):
        return [n for n in NODES if not (n == self.dead and self.round in self.unlisted)]

    def reply(self, message):
        node = message.metadata.dst_node_id
        kind = message.content.config_records["config"].get("fedsel", "train")
        self.asked.append((self.round, kind, node))
        if node == self.dead and kind == self.dies_on and self.round >= self.dies_at:
            self.gone = True
        if self.silent(node):
            return Message(Error(code=0, reason="node gone"), reply_to=message)
        arrays = message.content.array_records["arrays"].to_numpy_ndarrays()
        level = float(sum(a.sum() for a in arrays))
        loss = 1.0 + (node * 7 + self.round * 3) % 5 / 10 + 0.01 * level
        metrics = MetricRecord({"eval_loss": loss, "train_loss": loss, "num-examples": 10 * (node - 100)})
        content = {"metrics": metrics}
        if message.metadata.message_type == "train":
            step = 0.01 * ((node + self.round) % 3 + 1)
            content["arrays"] = ArrayRecord([a + step for a in arrays])
        return Message(RecordDict(content), reply_to=message)

    def send_and_receive(self, messages, timeout=None):
        return [self.reply(m) for m in messages]


def run(strategy, grid, rounds):
    """Plays `rounds` rounds of Flower's loop; the selection of each."""
    arrays = ArrayRecord([np.zeros((3, 4), np.float32), np.zeros(3, np.float32)])
    chosen = []
    for r in range(1, rounds + 1):
        grid.round = r
        messages = list(strategy.configure_train(r, arrays, ConfigRecord(), grid))
        chosen.append(sorted(m.metadata.dst_node_id for m in messages))
        new, _ = strategy.aggregate_train(r, [grid.reply(m) for m in messages])
        arrays = new if new is not None else arrays
    return chosen


def strategy(name, options):
    return FedselStrategy(name, per_round=2, num_rounds=5, seed=3, options=options, min_available_nodes=len(NODES))


@pytest.mark.parametrize(("name", "options"), [("powd", {"d": 4}), ("afl", {}), ("fedcor", {"warmup": 1})])
def test_a_node_that_stops_answering_queries_is_unavailable_for_the_round(name, options):
    """A node that dies is still listed by Flower for a while, so the selector may ask it
    for losses. Such a round must go on without it, and choose what the selector would have
    chosen had Flower not listed the node that round: nothing from the failed request leaks
    into the selector's state. (In a round that asks the node nothing, a selector may still
    choose it; its train reply then fails, as for F3AST and HiCS-FL.)"""
    dying = ScriptedGrid(dead=DEAD)
    s = strategy(name, options)
    chosen = run(s, dying, 5)
    unanswered = [h["unanswered"] for h in s.history]
    assert unanswered[0] == [] and [DEAD] in unanswered[1:], unanswered
    assert all(u in ([], [DEAD]) for u in unanswered)
    silent_rounds = {r for r, u in enumerate(unanswered, 1) if u}
    assert all(DEAD not in chosen[r - 1] for r in silent_rounds)
    assert chosen == run(strategy(name, options), ScriptedGrid(dead=DEAD, unlisted=silent_rounds), 5)
    # The messages to the dead node were sent, and booked as failed.
    assert any(r >= 2 and node == DEAD for r, _, node in dying.asked)
    assert s.ledger["failed_replies"] >= len(silent_rounds)


def test_a_selection_cut_short_starts_again_from_the_selectors_state_before_the_round():
    """FedCor's GP-training round first asks every node for its loss and fits the GP, then
    sends probes: a node that dies at the probe leaves a selector that has already learned
    from the round. Choosing again must start from the state before the round, or the
    choice differs from the one made had the node been unavailable."""
    options = {"warmup": 1, "interval": 1, "probes": 2}
    dying = ScriptedGrid(dead=DEAD, dies_at=3, dies_on="probe_loss")
    s = strategy("fedcor", options)
    chosen = run(s, dying, 5)
    assert (3, "loss", DEAD) in dying.asked and (3, "probe_loss", DEAD) in dying.asked
    silent_rounds = {r for r, h in enumerate(s.history, 1) if h["unanswered"]}
    assert 3 in silent_rounds
    assert chosen == run(strategy("fedcor", options), ScriptedGrid(dead=DEAD, dies_at=3, unlisted=silent_rounds), 5)


def test_a_round_where_no_node_answers_is_an_error_naming_the_strategy():
    class Mute(ScriptedGrid):
        def silent(self, node):
            return self.round >= 2

    s = strategy("powd", {"d": 4})
    with pytest.raises(FedselError, match="round 2: no available node answered the requests of strategy powd"):
        run(s, Mute(), 2)


def pytorch_like_state_dict():
    """A CNN's state_dict as NumPy arrays: two convolutions, a BatchNorm, two linear layers
    (the head is fc2), and a LayerNorm registered after the head."""
    f = np.float32
    return {
        "conv1.weight": np.zeros((8, 1, 5, 5), f),
        "conv1.bias": np.zeros(8, f),
        "bn1.weight": np.ones(8, f),
        "bn1.bias": np.zeros(8, f),
        "bn1.running_mean": np.zeros(8, f),
        "bn1.running_var": np.ones(8, f),
        "bn1.num_batches_tracked": np.array(0, np.int64),
        "conv2.weight": np.zeros((16, 8, 5, 5), f),
        "conv2.bias": np.zeros(16, f),
        "fc1.weight": np.zeros((64, 256), f),
        "fc1.bias": np.zeros(64, f),
        "fc2.weight": np.zeros((10, 64), f),
        "fc2.bias": np.zeros(10, f),
        "norm.weight": np.ones(10, f),
        "norm.bias": np.zeros(10, f),
    }


def test_the_output_layer_of_a_state_dict_is_its_last_linear_layer():
    """Not the last 1-D array (a norm's bias), nor a convolution's or BatchNorm's bias, nor
    the 0-d `num_batches_tracked`: the last `.bias` whose `.weight` is 2-D with as many rows."""
    assert output_layer(pytorch_like_state_dict()) == ("fc2.bias", "fc2.weight")
    sd = pytorch_like_state_dict()
    for k in ("fc2.weight", "fc2.bias", "norm.weight", "norm.bias"):
        del sd[k]
    assert output_layer(sd) == ("fc1.bias", "fc1.weight")
    # The NumPy example's softmax regression names its arrays without a prefix.
    assert output_layer({"weight": np.zeros((10, 784)), "bias": np.zeros(10)}) == ("bias", "weight")


def test_unnamed_arrays_fall_back_to_the_last_1d_array_after_a_2d_one():
    arrays = [np.zeros((8, 1, 5, 5)), np.zeros(8), np.zeros((10, 8)), np.zeros(10), np.ones(10), np.array(3)]
    record = ArrayRecord(arrays)
    assert output_layer({k: v.numpy() for k, v in record.items()}) == ("3", "2")


def test_a_model_without_an_output_layer_is_an_error_naming_its_arrays():
    conv_only = {"conv.weight": np.zeros((10, 1, 3, 3)), "conv.bias": np.zeros(10), "bn.num_batches_tracked": np.array(0)}
    with pytest.raises(FedselError, match=r"conv\.weight \(10, 1, 3, 3\), conv\.bias \(10,\), bn\.num_batches_tracked \(\).*output_keys"):
        output_layer(conv_only)


def test_output_keys_name_the_output_layer_and_must_exist():
    """A head that the rule does not find (a 1x1 convolution) is named with output_keys."""
    sd = {"head.weight": np.zeros((10, 16, 1, 1)), "head.bias": np.zeros(10)}
    s = FedselStrategy("hics", per_round=2, num_rounds=2, output_keys=("head.bias", "head.weight"))
    assert s._output_layer(sd) == ("head.bias", "head.weight")
    s = FedselStrategy("hics", per_round=2, num_rounds=2, output_keys=("fc.bias", "fc.weight"))
    with pytest.raises(FedselError, match=r"output_keys \['fc.bias', 'fc.weight'\] not in the model's arrays \['head.weight', 'head.bias'\]"):
        s._output_layer(sd)


def test_a_python_selector_object_chooses_on_flower_as_the_builtin_it_rewrites():
    """fedsel.selectors.PowD asks the nodes for their losses through `ctx.query`, which the
    strategy turns into evaluate messages, and draws from the round's stream: it chooses
    the nodes the built-in Pow-d chooses, round by round, with the same messages."""
    from fedsel.selectors import PowD

    builtin = strategy("powd", {"d": 4})
    ours = FedselStrategy(selector=PowD(d=4), per_round=2, num_rounds=5, seed=3, min_available_nodes=len(NODES))
    grid_a, grid_b = ScriptedGrid(), ScriptedGrid()
    assert run(ours, grid_b, 5) == run(builtin, grid_a, 5)
    assert grid_b.asked == grid_a.asked
    assert ours.strategy == "py:fedsel.selectors:PowD"
    with pytest.raises(FedselError, match="one of them"):
        FedselStrategy("powd", selector=PowD(d=4), per_round=2, num_rounds=5)
