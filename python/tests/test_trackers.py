"""Trackers: TensorBoard event files read back by TensorBoard's own reader (and tbparse),
`fedsel.run(on_round=...)`, and the W&B (offline) and MLflow (local file store) callbacks.

The readers and trackers are optional packages (python/test.sh installs them); a test whose
package is missing is skipped, saying which."""

import csv
import json
import math
import subprocess

import pytest

import fedsel


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def accumulator(logdir):
    ea_mod = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard is not installed (python/test.sh installs it from PyPI)",
    )
    ea = ea_mod.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    ea.Reload()
    return ea


def event_files(logdir):
    return sorted(p for p in logdir.iterdir() if "tfevents" in p.name)


def tol(column):
    """metrics.csv writes elapsed_s to 3 decimals, the other fractions to 6."""
    return 6e-4 if column == "elapsed_s" else 1e-6


def value(cell):
    return None if cell == "" else float(cell)


def test_tensorboard_holds_every_column_by_round_the_selection_and_the_config(tmp_path, cli):
    tb = tmp_path / "tb"
    subprocess.run(
        [cli, "run", "--set", "rounds=6", "--set", "eval.every=2", "--out", tmp_path / "run", "--tensorboard", tb],
        check=True,
        capture_output=True,
    )
    assert len(event_files(tb)) == 1
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    ea = accumulator(tb)
    # One test_acc per evaluated round, equal to metrics.csv's (TensorBoard keeps 32-bit floats).
    evaluated = [r for r in rows if r["test_acc"] != ""]
    assert 0 < len(evaluated) < len(rows)
    acc = ea.Scalars("test_acc")
    assert [e.step for e in acc] == [int(r["round"]) for r in evaluated]
    for e, r in zip(acc, evaluated):
        assert e.value == pytest.approx(float(r["test_acc"]), abs=1e-6)
    # Every other column, by round, where metrics.csv has a value.
    tags = set(ea.Tags()["scalars"])
    columns = [c for c in rows[0] if c != "round"]
    for c in columns:
        want = [(int(r["round"]), value(r[c])) for r in rows if r[c] != ""]
        if not want:
            assert c not in tags
            continue
        got = [(e.step, e.value) for e in ea.Scalars(c)]
        assert [s for s, _ in got] == [s for s, _ in want], c
        for (_, a), (_, b) in zip(got, want):
            assert a == pytest.approx(b, rel=1e-6, abs=tol(c)), c
    assert not any(t.startswith("time/") for t in tags), "no clock, no time-indexed tags"
    # The selection as a histogram of client ids.
    picked = {}
    for r in read_csv(tmp_path / "run" / "selections.csv"):
        picked.setdefault(int(r["round"]), []).append(int(r["client"]))
    hist = ea.Histograms("selection")
    assert [h.step for h in hist] == list(range(6))
    for h in hist:
        ids = picked[h.step]
        hv = h.histogram_value
        assert hv.num == len(ids) == int(rows[h.step]["n_selected"])
        assert (hv.min, hv.max, hv.sum) == (min(ids), max(ids), sum(ids))
        counts = {round(limit - 0.5): n for limit, n in zip(hv.bucket_limit, hv.bucket) if n}
        assert counts == {k: ids.count(k) for k in set(ids)}
    # The resolved config as text.
    (config,) = ea.Tensors("config")
    text = config.tensor_proto.string_val[0].decode()
    assert (tmp_path / "run" / "config.resolved.toml").read_text() in text


def test_tbparse_reads_the_same_test_acc(tmp_path, cli):
    tbparse = pytest.importorskip("tbparse", reason="tbparse is not installed (python/test.sh installs it from PyPI)")
    tb = tmp_path / "tb"
    subprocess.run(
        [cli, "run", "--set", "rounds=5", "--out", tmp_path / "run", "--tensorboard", tb],
        check=True,
        capture_output=True,
    )
    df = tbparse.SummaryReader(str(tb)).scalars
    acc = df[df["tag"] == "test_acc"].sort_values("step")
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    assert acc["step"].tolist() == [int(r["round"]) for r in rows]
    assert acc["value"].tolist() == pytest.approx([float(r["test_acc"]) for r in rows], abs=1e-6)


def test_a_clock_run_adds_every_column_by_virtual_milliseconds(tmp_path, cli):
    tb = tmp_path / "tb"
    subprocess.run(
        [cli, "run", "--set", "rounds=4", "--set", "system.kind=lognormal", "--out", tmp_path / "run", "--tensorboard", tb],
        check=True,
        capture_output=True,
    )
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    assert "clock_s" in rows[0]
    ea = accumulator(tb)
    steps = [round(float(r["clock_s"]) * 1000) for r in rows]
    assert steps == sorted(steps) and steps[0] > 0
    for tag, column in [("time/test_acc", "test_acc"), ("time/round", "round"), ("time/round_s", "round_s")]:
        got = ea.Scalars(tag)
        assert [e.step for e in got] == steps, tag
        assert [e.value for e in got] == pytest.approx([float(r[column]) for r in rows], rel=1e-6, abs=1e-6)
    assert [e.step for e in ea.Scalars("clock_s")] == list(range(4))


def test_config_key_and_a_sweep_give_each_cell_its_directory(tmp_path, cli):
    path = tmp_path / "s.toml"
    path.write_text('name = "t"\n[config]\nrounds = 3\n[axes]\nstrategy = ["uniform", "powd"]\n')
    tb = tmp_path / "tb"
    subprocess.run([cli, "sweep", path, "--out", tmp_path / "out", "--jobs", "1", "--tensorboard", tb], check=True, capture_output=True)
    cells = sorted(p.name for p in (tmp_path / "out" / "cells").iterdir() if p.is_dir())
    assert len(cells) == 2
    assert sorted(p.name for p in tb.iterdir()) == cells
    for c in cells:
        assert len(event_files(tb / c)) == 1
        assert len(accumulator(tb / c).Scalars("test_acc")) == 3
    # The key in a config file; it changes nothing else (nor the config's hash: resume
    # finds the run of the same config without it).
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'rounds = 2\n[output]\ntensorboard = "{(tmp_path / "tb2").as_posix()}"\n')
    subprocess.run([cli, "run", cfg, "--out", tmp_path / "run2"], check=True, capture_output=True)
    assert len(event_files(tmp_path / "tb2")) == 1
    assert "[output]" in (tmp_path / "run2" / "config.resolved.toml").read_text()
    again = fedsel.run({"rounds": 2}, out=tmp_path / "run2", resume=True)
    assert again.summary["status"] == "finished"
    assert len(event_files(tmp_path / "tb2")) == 1, "a finished run is not run again"


def test_on_round_is_called_once_per_round_with_the_metrics_row(tmp_path):
    records = []
    res = fedsel.run({"rounds": 5, "eval.every": 2}, out=tmp_path / "run", on_round=records.append)
    rows = read_csv(res.out_dir / "metrics.csv")
    assert [r["round"] for r in records] == list(range(5))
    for rec, row in zip(records, rows):
        assert list(rec) == list(row)
        for k, v in rec.items():
            if row[k] == "":
                assert v is None, k
            else:
                assert v == pytest.approx(float(row[k]), rel=1e-5, abs=tol(k)), k
    assert isinstance(records[0]["n_selected"], int) and isinstance(records[0]["train_loss"], float)
    assert records[0]["test_acc"] is None and records[1]["test_acc"] is not None


def test_an_exception_in_on_round_stops_the_run_after_that_round(tmp_path):
    class Stop(Exception):
        pass

    def cb(record):
        if record["round"] == 2:
            raise Stop("tracker down")

    with pytest.raises(Stop, match="tracker down"):
        fedsel.run({"rounds": 6}, out=tmp_path / "run", on_round=cb)
    assert len(read_csv(tmp_path / "run" / "metrics.csv")) == 3
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "interrupted"


def test_wandb_callback_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (python/test.sh installs it from PyPI)")
    from fedsel.integrations import wandb_callback

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cb = wandb_callback(project="fedsel-test", dir=str(tmp_path), config={"strategy": "uniform"})
    try:
        res = fedsel.run({"rounds": 4}, out=tmp_path / "run", on_round=cb)
        rows = read_csv(res.out_dir / "metrics.csv")
        assert cb.run.summary["test_acc"] == pytest.approx(float(rows[-1]["test_acc"]), abs=1e-6)
    finally:
        cb.finish()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert wandb.run is None


def test_mlflow_callback_against_a_local_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (python/test.sh installs mlflow-skinny from PyPI)")
    # MLflow 3 keeps the file store in maintenance mode: it refuses it unless asked.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    from fedsel.integrations import mlflow_callback

    uri = (tmp_path / "mlruns").as_uri()
    cb = mlflow_callback("fedsel-test", tracking_uri=uri, run_name="uniform", params={"strategy": "uniform"})
    res = fedsel.run({"rounds": 4, "eval.every": 2}, out=tmp_path / "run", on_round=cb)
    cb.finish()
    rows = read_csv(res.out_dir / "metrics.csv")
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(cb.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"strategy": "uniform"}
    hist = sorted(client.get_metric_history(cb.run_id, "test_acc"), key=lambda m: m.step)
    want = [(int(r["round"]), float(r["test_acc"])) for r in rows if r["test_acc"] != ""]
    assert [(m.step, m.value) for m in hist] == [(s, pytest.approx(v, abs=1e-6)) for s, v in want]
    assert len(client.get_metric_history(cb.run_id, "train_loss")) == 4
    assert all(math.isfinite(m.value) for m in client.get_metric_history(cb.run_id, "uploads"))
