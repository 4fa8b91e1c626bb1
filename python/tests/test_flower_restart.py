"""A FedselStrategy with a checkpoint_dir survives a restart of its ServerApp.

A scripted grid (the strategy's whole loop, `start`, in this process) and the Flower
example app on the simulation engine: a run stopped after round 6 of 12 and restarted
from its checkpoint makes the same selections and ends with the same arrays as an
uninterrupted one. Skipped where flwr is not installed (the simulation, also where its
simulation extra or the Fashion-MNIST files are missing).
"""

import json

import numpy as np
import pytest

flwr = pytest.importorskip("flwr", reason="flwr is not installed")

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedsel import FedselError  # noqa: E402
from fedsel import _checkpoint  # noqa: E402
from fedsel.flower import FedselStrategy  # noqa: E402


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Messages can only be made inside a Flower task; these tests play the ServerApp's."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)


class Grid:
    """Six nodes whose replies depend on their partition (reported as `partition-id`),
    the round and the model, not on their Flower ids, which `first_id` sets (a restarted
    simulation draws new ones)."""

    def __init__(self, first_id=101):
        self.ids = [first_id + 17 * p for p in range(6)]

    def get_node_ids(self):
        return list(self.ids)

    def reply(self, message):
        p = self.ids.index(message.metadata.dst_node_id)
        config = message.content.config_records["config"]
        r = int(config.get("server-round", 0))
        arrays = message.content.array_records["arrays"].to_numpy_ndarrays()
        level = float(sum(a.sum() for a in arrays))
        loss = 1.0 + (p * 7 + r * 3) % 5 / 10 + 0.01 * level
        metrics = MetricRecord({"eval_loss": loss, "train_loss": loss, "num-examples": 10 * (p + 1), "partition-id": p})
        content = {"metrics": metrics}
        if message.metadata.message_type == "train":
            step = np.float32(0.01 * ((p + r) % 3 + 1))
            content["arrays"] = ArrayRecord([a + step * (1 + a) for a in arrays])
        return Message(RecordDict(content), reply_to=message)

    def send_and_receive(self, messages, timeout=None):
        return [self.reply(m) for m in messages]


class Stop(Exception):
    pass


def make(checkpoint_dir=None, strategy="fedcor", seed=3, **kw):
    return FedselStrategy(strategy, per_round=2, num_rounds=12, seed=seed, options={"warmup": 2} if strategy == "fedcor" else {},
                          min_available_nodes=6, checkpoint_dir=checkpoint_dir, **kw)


def start(s, grid, stop_after=None):
    initial = ArrayRecord([np.zeros((3, 4), np.float32), np.zeros(3, np.float32)])

    def evaluate(r, arrays):
        evaluated.append(r)
        if r == stop_after:
            raise Stop
        return None

    evaluated: list[int] = []
    try:
        result = s.start(grid, initial, num_rounds=12, evaluate_fn=evaluate)
    except Stop:
        return None, evaluated
    return {k: v.numpy() for k, v in result.arrays.items()}, evaluated


def selections(s, by_key):
    keys = s.node_keys
    return [sorted(keys[n] if by_key else n for n in h["selected"]) for h in s.history]


@pytest.mark.parametrize("node_key", [None, "partition-id"])
def test_a_restarted_strategy_goes_on_as_an_uninterrupted_one(tmp_path, node_key):
    whole = make(tmp_path / "whole", node_key=node_key)
    final, evaluated = start(whole, Grid())
    assert evaluated == list(range(13))

    first = make(tmp_path / "cut", node_key=node_key, checkpoint_every=3)
    assert start(first, Grid(), stop_after=7) == (None, list(range(8)))
    # The checkpoint is that of round 6 (every 3 rounds): round 7 is done again.
    meta, _ = _checkpoint.load(tmp_path / "cut")
    assert meta["round"] == 6 and len(meta["history"]) == 6

    # Node ids change across the restart where nodes are known by their key.
    again = make(tmp_path / "cut", node_key=node_key, checkpoint_every=3)
    resumed, evaluated = start(again, Grid(first_id=501 if node_key else 101))
    assert evaluated == list(range(6, 13))
    assert selections(again, node_key) == selections(whole, node_key)
    assert [h["round"] for h in again.history] == list(range(1, 13))
    assert all(np.array_equal(final[k], resumed[k]) for k in final)
    assert again.ledger["train_messages"] == whole.ledger["train_messages"]

    # A finished run's checkpoint runs no round.
    done = make(tmp_path / "cut", node_key=node_key)
    last, evaluated = start(done, Grid(first_id=501 if node_key else 101))
    assert evaluated == [12] and all(np.array_equal(final[k], last[k]) for k in final)


def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(tmp_path):
    start(make(tmp_path, checkpoint_every=2), Grid(), stop_after=2)
    with pytest.raises(FedselError, match=r"strategy 'fedcor' \(this strategy's: 'powd'\)"):
        start(make(tmp_path, strategy="powd", checkpoint_every=2), Grid())
    with pytest.raises(FedselError, match=r"seed 3 \(this strategy's: 4\)"):
        start(make(tmp_path, seed=4, checkpoint_every=2), Grid())
    other = make(tmp_path, checkpoint_every=2)
    with pytest.raises(FedselError, match=r"array `1` of shape \(3,\), dtype <f4 \(the model's: shape \(5,\)"):
        other.start(Grid(), ArrayRecord([np.zeros((3, 4), np.float32), np.zeros(5, np.float32)]), num_rounds=12)


def test_the_checkpoint_is_replaced_atomically(tmp_path, monkeypatch):
    """A save that fails midway (here: the disk is full at fsync) leaves the last
    checkpoint whole and no temporary file behind."""
    s = make(tmp_path, checkpoint_every=1)
    start(s, Grid(), stop_after=2)
    before = (tmp_path / _checkpoint.FILE).read_bytes()

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_checkpoint.os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        start(make(tmp_path, checkpoint_every=1), Grid())
    assert (tmp_path / _checkpoint.FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [_checkpoint.FILE]


def test_checkpoint_every_must_be_a_number_of_rounds():
    with pytest.raises(FedselError, match="checkpoint_every is 0"):
        make(checkpoint_every=0)


def test_example_app_restarted_after_round_6_of_12_matches_an_uninterrupted_run(tmp_path):
    """The acceptance test of issue 43: FedCor on 4 simulated nodes, 2 per round."""
    from test_flower import APP, flower_or_skip, run_app

    bin_dir = flower_or_skip()

    def run(label, checkpoint, stop_after=0):
        d = tmp_path / label
        d.mkdir()
        results = d / "results.json"
        config = (
            f'strategy="fedcor" num-server-rounds=12 clients=4 per-round=2 local-steps=5 '
            f'test-examples=500 results="{results}" checkpoint-dir="{checkpoint}" '
            f"checkpoint-every=3 stop-after={stop_after}"
        )
        log = run_app(d, bin_dir, APP, config, nodes=4, label=label)
        assert results.is_file(), log
        return json.loads(results.read_text()), log

    whole, _ = run("whole", tmp_path / "ckpt-whole")
    cut, log = run("cut", tmp_path / "ckpt", stop_after=6)
    assert cut["done"] == 6, log
    meta, _ = _checkpoint.load(tmp_path / "ckpt")
    assert meta["round"] == 6
    resumed, log = run("resumed", tmp_path / "ckpt")
    assert resumed["done"] == 12, log

    def picks(out):
        keys = {int(k): v for k, v in out["node_keys"].items()}
        return [sorted(keys[n] for n in h["selected"]) for h in out["history"]]

    assert len(picks(whole)) == 12
    assert picks(resumed) == picks(whole)
    assert picks(cut) == picks(whole)[:6]
    assert resumed["final_arrays"] == whole["final_arrays"]
    assert resumed["test_acc"]["12"] == whole["test_acc"]["12"]
