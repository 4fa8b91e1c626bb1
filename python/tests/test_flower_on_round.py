"""FedselStrategy's `on_round` callback, driven by test_flower_strategy's scripted grid."""

import pytest

pytest.importorskip("flwr", reason="flwr is not installed")

from test_flower_strategy import NODES, ScriptedGrid, run, task_identity  # noqa: E402, F401

from fedsel.flower import FedselStrategy  # noqa: E402


def test_on_round_gets_each_rounds_record():
    records = []
    s = FedselStrategy("uniform", per_round=2, num_rounds=3, seed=3, min_available_nodes=len(NODES), on_round=records.append)
    chosen = run(s, ScriptedGrid(), 3)
    assert [r["round"] for r in records] == [1, 2, 3]
    for rec, picked in zip(records, chosen):
        assert rec["n_selected"] == len(picked) == 2
        assert rec["n_available"] == len(NODES)
        assert rec["n_failed"] == 0
        assert rec["train_messages"] == 2
        assert rec["train_loss"] > 0
