"""The Flower example app with a fedsel strategy, on Flower's simulation engine.

A small federation (4 nodes, 2 per round, 2 rounds) runs through `flwr run` against a
SuperLink this test starts, and stops, itself. Skipped, with the reason, where flwr (with
its simulation extra) or the Fashion-MNIST files are missing.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, data_dir

APP = ROOT / "examples" / "flower-fmnist"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(address: str, link: subprocess.Popen, log: Path, within: float = 120.0) -> None:
    """Waits until the SuperLink accepts connections on `address` (slow on a busy machine)."""
    host, port = address.rsplit(":", 1)
    deadline = time.time() + within
    while True:
        assert link.poll() is None, f"flower-superlink exited: {log.read_text()}"
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            assert time.time() < deadline, f"no SuperLink on {address} after {within}s: {log.read_text()}"
            time.sleep(0.5)


def flower_or_skip() -> Path:
    pytest.importorskip("flwr", reason="flwr is not installed")
    pytest.importorskip("ray", reason="flwr's simulation extra (ray) is not installed")
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "flwr").exists() or not (bin_dir / "flower-superlink").exists():
        pytest.skip(f"the flwr and flower-superlink commands are not in {bin_dir}")
    if not (data_dir() / "fashion-mnist").is_dir():
        pytest.skip(f"Fashion-MNIST not found under {data_dir()}")
    return bin_dir


def run_app(tmp_path: Path, bin_dir: Path, app: Path, run_config: str, nodes: int, label: str, federation: str = "") -> str:
    """Runs the Flower app `app` with `nodes` simulated nodes (and the simulation's other
    `federation` config, e.g. its CPUs per ClientApp) through `flwr run`, against a
    SuperLink started (and stopped) here with its own FLWR_HOME under `tmp_path`; returns the
    streamed log's tail, for the caller's assertion messages (`flwr run` exits 0 even when
    the ServerApp fails)."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    # flwr 1.41 serves its Control, Fleet and runtime APIs on one HTTP address.
    control = f"127.0.0.1:{free_port()}"
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "test"\n\n'
        f'[superlink.test]\naddress = "{control}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FEDSEL_DATA": str(data_dir()),
        # One BLAS thread in every process of the simulation: the ServerApp's evaluation
        # (a 500 x 784 product in numpy's OpenBLAS) once span at 100 % CPU for the whole
        # 600 s, its threads waiting on each other beside Ray's, which no test should depend
        # on; the nodes' work is too small for BLAS threads to matter.
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
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
    try:
        wait_for(control, link, tmp_path / "superlink.log")
        t0 = time.time()
        p = subprocess.run(
            [bin_dir / "flwr", "run", app, "test", "--run-config", run_config,
             "--federation-config", f"num-supernodes={nodes} {federation}", "--stream"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        print(f"flwr run {label}: {time.time() - t0:.1f}s")
        log = p.stdout[-3000:] + p.stderr[-3000:]
        assert p.returncode == 0, log
        return log
    finally:
        link.terminate()
        link.wait(timeout=30)


@pytest.mark.parametrize(
    ("strategy", "options"),
    [("hics", ""), ("fedcor", ""), ("f3ast", ""), ("fedgs", '{"graph": "update"}')],
)
def test_example_app_runs_a_fedsel_strategy_on_the_simulation_engine(tmp_path, strategy, options):
    bin_dir = flower_or_skip()
    results = tmp_path / "results.json"
    run_config = (
        f'strategy="{strategy}" num-server-rounds=2 clients=4 per-round=2 '
        f'local-steps=5 test-examples=500 results="{results}"'
    )
    if options:
        run_config += f" options='{options}'"
    run_app(tmp_path, bin_dir, APP, run_config, nodes=4, label=strategy)
    assert results.is_file()
    out = json.loads(results.read_text())
    assert out["strategy"] == strategy and out["rounds"] == 2
    ledger = out["ledger"]
    assert ledger["size_messages"] == 4 and ledger["size_replies"] == 4
    assert ledger["train_messages"] == 4 and ledger["train_replies"] == 4
    assert ledger["failed_replies"] == 0
    if strategy == "fedcor":
        assert ledger["loss_messages"] > 0
    if strategy == "fedgs":
        # FedGS_cos builds its graph from one local update of every node, before round 1.
        assert ledger["update_train_messages"] == 4
    for h in out["history"]:
        assert len(h["selected"]) == 2 and set(h["selected"]) <= set(h["available"])
        assert len(h["available"]) == 4
    assert set(out["test_acc"]) == {"0", "1", "2"}
    assert out["test_acc"]["2"] > 0.1
