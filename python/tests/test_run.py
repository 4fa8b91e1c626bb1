"""`fedsel.run` against the CLI: same config and seed, same rows."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import fedsel


def rows_without_timing(path):
    """metrics.csv without its `elapsed_s` column, the only one that depends on the clock."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    drop = rows[0].index("elapsed_s")
    return [r[:drop] + r[drop + 1 :] for r in rows]


def test_dict_over_default_matches_the_cli(tmp_path, cli):
    res = fedsel.run({"rounds": 20, "seed": 3}, out=tmp_path / "py")
    subprocess.run(
        [cli, "run", "--set", "rounds=20", "--seed", "3", "--out", tmp_path / "cli"],
        check=True,
        capture_output=True,
    )
    ours = rows_without_timing(res.out_dir / "metrics.csv")
    theirs = rows_without_timing(tmp_path / "cli" / "metrics.csv")
    assert len(ours) == 21
    assert ours == theirs
    assert res.summary["status"] == "finished"
    assert res.summary["rounds"] == 20
    assert res.metrics["round"].tolist() == list(range(20))
    assert res.metrics["test_acc"].dtype == np.float64
    assert res.metrics["test_acc"][-1] == pytest.approx(res.summary["final_acc"], abs=1e-6)


def test_toml_string_path_and_overrides_match_the_cli(tmp_path, cli):
    text = 'rounds = 8\nseed = 5\n[selection]\nstrategy = "powd"\n'
    path = tmp_path / "c.toml"
    path.write_text(text)
    a = fedsel.run(text, overrides={"train.lr": 0.05}, out=tmp_path / "text")
    b = fedsel.run(path, overrides=["train.lr=0.05"], out=tmp_path / "path")
    subprocess.run(
        [cli, "run", path, "--set", "train.lr=0.05", "--out", tmp_path / "cli"],
        check=True,
        capture_output=True,
    )
    want = rows_without_timing(tmp_path / "cli" / "metrics.csv")
    assert rows_without_timing(a.out_dir / "metrics.csv") == want
    assert rows_without_timing(b.out_dir / "metrics.csv") == want
    assert a.summary["strategy"] == "powd"


def test_bad_config_raises_fedsel_error_naming_the_key(tmp_path):
    with pytest.raises(fedsel.FedselError, match="train.lr"):
        fedsel.run({"train": {"lr": -1.0}}, out=tmp_path / "a")
    with pytest.raises(fedsel.FedselError, match="selection.strategy"):
        fedsel.run({"selection.strategy": "nope"}, out=tmp_path / "b")
    with pytest.raises(fedsel.FedselError, match="lrr"):
        fedsel.run({"train": {"lrr": 0.1}}, out=tmp_path / "c")


def test_error_message_is_the_clis(tmp_path, cli):
    with pytest.raises(fedsel.FedselError) as caught:
        fedsel.run({"train": {"lr": -1.0}}, out=tmp_path / "a")
    p = subprocess.run(
        [cli, "run", "--set", "train.lr=-1", "--out", tmp_path / "b"], capture_output=True, text=True
    )
    assert p.returncode != 0
    assert str(caught.value) in p.stderr


def test_an_existing_run_is_refused_unless_overwrite(tmp_path):
    fedsel.run({"rounds": 2}, out=tmp_path / "r")
    with pytest.raises(fedsel.FedselError, match="already holds a run") as caught:
        fedsel.run({"rounds": 2}, out=tmp_path / "r")
    # Python's keywords, not the CLI's flags.
    assert "pass overwrite=True to replace it, or resume=True" in str(caught.value)
    assert "--" not in str(caught.value)
    assert fedsel.run({"rounds": 3}, out=tmp_path / "r", overwrite=True).summary["rounds"] == 3


RESUMABLE = {"rounds": 20, "checkpoint_every": 5, "seed": 4}


def test_resume_starts_continues_or_returns_a_run(tmp_path):
    import shutil

    full = fedsel.run(RESUMABLE, out=tmp_path / "full", resume=True)
    assert full.summary["status"] == "finished" and full.summary["rounds"] == 20
    # Finished: returned as it is, nothing run again.
    before = (tmp_path / "full" / "metrics.csv").read_text()
    again = fedsel.run(RESUMABLE, out=tmp_path / "full", resume=True)
    assert (again.summary, again.warnings) == (full.summary, [])
    assert (tmp_path / "full" / "metrics.csv").read_text() == before
    # Killed after its last round but before its summary: it continues from the
    # checkpoint after round 15, and ends as the uninterrupted run did.
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    (tmp_path / "cut" / "summary.json").unlink()
    cut = fedsel.run(RESUMABLE, out=tmp_path / "cut", resume=True)
    assert cut.summary["status"] == "finished"
    assert cut.summary["final_acc"] == full.summary["final_acc"]
    assert rows_without_timing(tmp_path / "cut" / "metrics.csv") == rows_without_timing(
        tmp_path / "full" / "metrics.csv"
    )


def test_resume_refuses_another_config_or_overwrite(tmp_path):
    fedsel.run(RESUMABLE, out=tmp_path / "r")
    with pytest.raises(fedsel.FedselError, match="another config") as caught:
        fedsel.run({**RESUMABLE, "seed": 5}, out=tmp_path / "r", resume=True)
    assert "overwrite=True" in str(caught.value)
    with pytest.raises(fedsel.FedselError, match="pass one of them"):
        fedsel.run(RESUMABLE, out=tmp_path / "r", resume=True, overwrite=True)


def test_to_pandas(tmp_path):
    pd = pytest.importorskip("pandas", reason="pandas is not installed")
    df = fedsel.run({"rounds": 3}, out=tmp_path / "r").to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == 3


# The child takes SIGINT as a terminal's Ctrl-C does, whatever it inherited: a background
# job of a non-interactive shell (a CI script's `cmd &`) starts with SIGINT ignored, and
# Python then installs no KeyboardInterrupt handler.
CHILD = """
import signal, sys, fedsel
signal.signal(signal.SIGINT, signal.default_int_handler)
print("started", flush=True)
fedsel.run({"rounds": 100000, "eval.every": 1000}, out=sys.argv[1], progress=False)
"""


def test_ctrl_c_stops_between_rounds_and_leaves_readable_outputs(tmp_path):
    out = tmp_path / "r"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "started"
    deadline = time.time() + 60
    while not (out / "metrics.csv").exists() or os.path.getsize(out / "metrics.csv") < 2000:
        assert time.time() < deadline, "the run wrote no rounds"
        time.sleep(0.1)
    child.send_signal(signal.SIGINT)
    try:
        _, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        pytest.fail(f"the run went on for 60 s after SIGINT; its stderr: {err}")
    assert child.returncode != 0, err
    assert "KeyboardInterrupt" in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    assert "interrupted" in summary["error"], summary
    metrics = fedsel.read_metrics(out / "metrics.csv")
    done = len(metrics["round"])
    assert 0 < done < 100000
    assert summary["rounds_completed"] == done, (summary, done)
    assert metrics["round"].tolist() == list(range(done))


def test_sweep_and_report(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "t"\n[config]\nrounds = 20\n[axes]\nseed = [1, 2]\n')
    out = tmp_path / "out"
    first = fedsel.sweep(path, out, jobs=1, rounds=3)
    assert (first["total"], first["skipped"], first["ran"], first["failed"]) == (2, 0, 2, [])
    assert first["report"].is_file()
    again = fedsel.sweep(path, out, jobs=1, rounds=3)
    assert (again["skipped"], again["ran"]) == (2, 0)
    text = fedsel.report(out)
    assert text == (out / "report.md").read_text()
    with pytest.raises(fedsel.FedselError, match="Savitzky"):
        fedsel.report(out, smooth=4)


def test_a_sweep_stops_when_its_first_cells_fail_alike_unless_keep_going(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "t"\n[config]\nrounds = 2\ndataset = { kind = "fmnist" }\n[axes]\nseed = [1, 2, 3, 4]\n'
    )
    empty = tmp_path / "no-data"
    empty.mkdir()
    with pytest.raises(fedsel.FedselError, match="keep_going=True runs them") as caught:
        fedsel.sweep(path, tmp_path / "a", jobs=1, data_dir=empty)
    said = str(caught.value)
    assert "so 2 cells were not started" in said and said.count("files not found") == 1, said
    with pytest.raises(fedsel.FedselError, match="4 cells failed"):
        fedsel.sweep(path, tmp_path / "b", jobs=1, data_dir=empty, keep_going=True)


def _rows_without_timing(cell_dir):
    """A run's metrics rows without the wall-clock column, which differs between runs."""
    return rows_without_timing(cell_dir / "metrics.csv")


def _cells(out):
    return sorted(p for p in (out / "cells").iterdir() if p.is_dir())


def test_sweep_through_an_executor_equals_a_local_one(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "s.toml"
    path.write_text(
        'name = "t"\nbaseline = "uniform"\n[config]\nrounds = 4\n'
        '[axes]\nstrategy = ["uniform", "md"]\nseed = [1, 2]\n'
    )
    local = fedsel.sweep(path, tmp_path / "local", jobs=1)
    with ThreadPoolExecutor(2) as pool:
        spread = fedsel.sweep(path, tmp_path / "pool", executor=pool)
    assert (spread["total"], spread["ran"], spread["failed"]) == (4, 4, [])
    assert spread["report"].is_file()
    assert [c.name for c in _cells(tmp_path / "pool")] == [c.name for c in _cells(tmp_path / "local")]
    for a, b in zip(_cells(tmp_path / "local"), _cells(tmp_path / "pool")):
        assert _rows_without_timing(a) == _rows_without_timing(b), a.name
    assert local["total"] == 4
    with pytest.raises(fedsel.FedselError, match="executor="):
        fedsel.sweep(path, tmp_path / "bad", executor="dask")


def test_ray_executor_sweep_equals_a_local_one(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'fedsel[ray]')")
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "t"\n[config]\nrounds = 4\n[axes]\nstrategy = ["uniform", "powd"]\nseed = [1, 2]\n'
    )
    fedsel.sweep(path, tmp_path / "local", jobs=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = fedsel.sweep(path, tmp_path / "ray", executor="ray")
    finally:
        ray.shutdown()
    assert (remote["total"], remote["ran"], remote["failed"]) == (4, 4, [])
    assert [c.name for c in _cells(tmp_path / "ray")] == [c.name for c in _cells(tmp_path / "local")]
    for a, b in zip(_cells(tmp_path / "local"), _cells(tmp_path / "ray")):
        assert _rows_without_timing(a) == _rows_without_timing(b), a.name
    assert "4 finished" in (tmp_path / "ray" / "report.md").read_text()


def test_progress_lines_only_when_asked_off_a_terminal(tmp_path, capsys):
    fedsel.run({"rounds": 10}, out=tmp_path / "quiet")
    assert "done" not in capsys.readouterr().err
    fedsel.run({"rounds": 10}, out=tmp_path / "asked", progress=True)
    err = capsys.readouterr().err
    assert "round 9 (10/10 done)" in err
    assert err.count("done") == 10
