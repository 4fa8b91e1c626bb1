"""The PyTorch Flower example with HiCS-FL, on Flower's simulation engine.

A federation of 2 nodes (Flower's default size), both trained in each of 2 rounds of a
few local steps, runs `examples/flower-pytorch` through `flwr run` against a SuperLink this
test starts, and stops, itself. HiCS-FL reads the CNN's output layer from the state dict's
keys (`fc2`): its class count at the start, and every train reply's output-layer update,
which round 1 (its warm-up, every node once) feeds to round 2's clustered sampling. Skipped, with the reason, where torch,
flwr (with its simulation extra) or the Fashion-MNIST files are missing.
"""

import json

import pytest

from conftest import ROOT
from test_flower import flower_or_skip, run_app

APP = ROOT / "examples" / "flower-pytorch"
NODES = 2


def test_pytorch_example_runs_hics_on_the_simulation_engine(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (examples/flower-pytorch/README.md installs the CPU wheel)")
    bin_dir = flower_or_skip()
    results = tmp_path / "results.json"
    run_config = (
        f'strategy="hics" num-server-rounds=2 per-round={NODES} '
        f'local-steps=3 test-examples=500 results="{results}"'
    )
    log = run_app(tmp_path, bin_dir, APP, run_config, nodes=NODES, label="pytorch hics")
    assert results.is_file(), log
    out = json.loads(results.read_text())
    assert out["strategy"] == "hics" and out["done"] == out["rounds"] == 2, log
    ledger = out["ledger"]
    assert ledger["size_messages"] == NODES and ledger["size_replies"] == NODES
    assert ledger["train_messages"] == 2 * NODES and ledger["train_replies"] == 2 * NODES
    assert ledger["failed_replies"] == 0
    for h in out["history"]:
        assert sorted(h["selected"]) == sorted(h["available"])
        assert len(h["available"]) == NODES
    assert set(out["test_acc"]) == {"0", "1", "2"}
