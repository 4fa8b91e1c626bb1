"""The PyTorch Flower example with HiCS-FL, on Flower's simulation engine.

A federation of 2 nodes (Flower's default size), both trained in each of 2 rounds of a
few local steps, runs `examples/flower-pytorch` through `flwr run` against a SuperLink this
test starts, and stops, itself. HiCS-FL reads the CNN's output layer from the state dict's
keys (`fc2`): its class count at the start, and every train reply's output-layer update,
which round 1 (its warm-up, every node once) feeds to round 2's clustered sampling. Skipped, with the reason, where torch,
flwr (with its simulation extra) or the Fashion-MNIST files are missing.
"""

import json
import os
import subprocess
import time

import pytest

from conftest import ROOT, data_dir
from test_flower import flower_or_skip, free_port, wait_for

APP = ROOT / "examples" / "flower-pytorch"
NODES = 2


def test_pytorch_example_runs_hics_on_the_simulation_engine(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (examples/flower-pytorch/README.md installs the CPU wheel)")
    bin_dir = flower_or_skip()
    home = tmp_path / "flwr-home"
    home.mkdir()
    control = f"127.0.0.1:{free_port()}"
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "test"\n\n'
        f'[superlink.test]\naddress = "{control}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FEDSEL_DATA": str(data_dir()),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    link = subprocess.Popen(
        [
            bin_dir / "flower-superlink",
            "--insecure",
            "--simulation",
            "--isolation", "subprocess",
            "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1",
            "--port", control.rsplit(":", 1)[1],
            "--database", str(tmp_path / "state.db"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "superlink.log", "w"),
    )
    results = tmp_path / "results.json"
    try:
        wait_for(control, link, tmp_path / "superlink.log")
        run_config = (
            f'strategy="hics" num-server-rounds=2 per-round={NODES} '
            f'local-steps=3 test-examples=500 results="{results}"'
        )
        t0 = time.time()
        p = subprocess.run(
            [bin_dir / "flwr", "run", APP, "test", "--run-config", run_config,
             "--federation-config", f"num-supernodes={NODES}", "--stream"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        print(f"flwr run pytorch hics: {time.time() - t0:.1f}s")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert results.is_file(), p.stdout[-3000:]
    finally:
        link.terminate()
        link.wait(timeout=30)
    out = json.loads(results.read_text())
    assert out["strategy"] == "hics" and out["rounds"] == 2
    ledger = out["ledger"]
    assert ledger["size_messages"] == NODES and ledger["size_replies"] == NODES
    assert ledger["train_messages"] == 2 * NODES and ledger["train_replies"] == 2 * NODES
    assert ledger["failed_replies"] == 0
    for h in out["history"]:
        assert sorted(h["selected"]) == sorted(h["available"])
        assert len(h["available"]) == NODES
    assert set(out["test_acc"]) == {"0", "1", "2"}
