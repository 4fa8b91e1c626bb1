"""Selectors written in Python (`py:module:Class`, `selector=`): the same runs as fedsel's
own strategies, resumed exactly, and refused plainly when they return what no server can
use. The selectors are in `user_selectors.py`, beside this file."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedsel
import user_selectors

HERE = Path(__file__).resolve().parent
BASE = {"rounds": 12, "seed": 4, "selection.clients_per_round": 5}


def rows(path, drop=("elapsed_s",)):
    """A CSV's rows without the columns that depend on the machine's clock."""
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    keep = [i for i, name in enumerate(table[0]) if name not in drop]
    return [[r[i] for i in keep] for r in table]


def same_run(a, b):
    assert rows(a / "metrics.csv") == rows(b / "metrics.csv")
    assert rows(a / "selections.csv") == rows(b / "selections.csv")


def test_python_uniform_through_ctx_rng_is_the_builtin_uniform(tmp_path):
    builtin = fedsel.run(BASE, out=tmp_path / "builtin")
    ours = fedsel.run(BASE, overrides={"selection.strategy": "py:fedsel.selectors:Uniform"}, out=tmp_path / "py")
    same_run(builtin.out_dir, ours.out_dir)
    assert ours.summary["strategy"] == "py:fedsel.selectors:Uniform"
    assert ours.summary["cost"] == builtin.summary["cost"]


def test_python_powd_through_query_losses_is_the_builtin_powd(tmp_path):
    """Pow-d asks d clients for their held-out losses: the query is answered and booked
    in the cost ledger exactly as for the built-in strategy."""
    setup = {**BASE, "availability.kind": "scarce"}
    builtin = fedsel.run({**setup, "selection.strategy": "powd", "selection.powd.d": 9}, out=tmp_path / "builtin")
    text = (
        'rounds = 12\nseed = 4\n[availability]\nkind = "scarce"\n[selection]\nclients_per_round = 5\n'
        'strategy = "py:fedsel.selectors:PowD"\n[selection.params]\nd = 9\n'
    )
    ours = fedsel.run(text, out=tmp_path / "py")
    same_run(builtin.out_dir, ours.out_dir)
    assert ours.summary["cost"] == builtin.summary["cost"]
    assert ours.summary["cost"]["evaluations"] > 0
    resolved = (ours.out_dir / "config.resolved.toml").read_text()
    assert 'strategy = "py:fedsel.selectors:PowD"' in resolved and "d = 9" in resolved


def test_a_selector_object_runs_and_is_named_by_its_class(tmp_path):
    chooser = user_selectors.LossGreedy(explore=0.4)
    res = fedsel.run(BASE, selector=chooser, out=tmp_path / "obj")
    assert res.summary["status"] == "finished"
    assert res.summary["strategy"] == "py:user_selectors:LossGreedy"
    # It heard every round, as the built-in strategies do.
    assert chooser.seen_rounds == list(range(12))
    # The same class named in the config, with the same arguments, is the same run.
    named = fedsel.run(
        {**BASE, "selection.strategy": "py:user_selectors:LossGreedy", "selection.params": {"explore": 0.4}},
        out=tmp_path / "named",
    )
    same_run(res.out_dir, named.out_dir)


def test_an_interrupted_python_selector_resumes_to_the_uninterrupted_run(tmp_path):
    setup = {**BASE, "rounds": 14, "checkpoint_every": 5, "selection.strategy": "py:user_selectors:LossGreedy"}
    full = fedsel.run(setup, out=tmp_path / "full")

    def stop_at_8(row):
        if row["round"] == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fedsel.run(setup, out=tmp_path / "cut", on_round=stop_at_8)
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["status"] == "interrupted"
    resumed = fedsel.run(setup, out=tmp_path / "cut", resume=True)
    assert resumed.summary["status"] == "finished"
    same_run(full.out_dir, resumed.out_dir)
    assert resumed.summary["cost"] == full.summary["cost"]


def test_a_selector_without_state_runs_but_refuses_to_resume_saying_why(tmp_path):
    setup = {**BASE, "checkpoint_every": 5, "selection.strategy": "py:user_selectors:Stateless"}
    a = fedsel.run(setup, out=tmp_path / "a")
    b = fedsel.run(setup, out=tmp_path / "b")
    same_run(a.out_dir, b.out_dir)  # ctx.rng.numpy() is the run's own stream

    def stop_at_7(row):
        if row["round"] == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fedsel.run(setup, out=tmp_path / "cut", on_round=stop_at_7)
    kept = (tmp_path / "cut" / "metrics.csv").read_text()
    with pytest.raises(fedsel.FedselError, match=r"state\(self\)` and `load_state\(self, state\)`"):
        fedsel.run(setup, out=tmp_path / "cut", resume=True)
    assert (tmp_path / "cut" / "metrics.csv").read_text() == kept


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("duplicate", r"client \d+ is chosen twice"),
        ("unavailable", r"client \d+ is not available in this round"),
        ("out_of_range", r"client 35 is out of range: the clients are 0\.\.29"),
        ("too_many", r"6 clients, over the round's budget K_t = 5"),
        ("float", r"\d+\.0 is not a client id"),
        ("none", r"returned None: return a sequence of client ids"),
        ("raises", r"select\(\) raised:\nTraceback[\s\S]*user_selectors\.py[\s\S]*KeyError: 'no such key'"),
    ],
)
def test_what_no_server_can_use_stops_the_run_naming_round_and_value(tmp_path, bad, says):
    setup = {**BASE, "availability.kind": "scarce", "selection.strategy": "py:user_selectors:Returns", "selection.params": {"bad": bad}}
    with pytest.raises(fedsel.FedselError) as caught:
        fedsel.run(setup, out=tmp_path / "r")
    message = str(caught.value)
    assert "py:user_selectors:Returns" in message and "round 3" in message, message
    assert __import__("re").search(says, message), message
    if bad not in ("none", "raises"):
        assert "returned [" in message, message
    # The three rounds before it are kept; the summary says why the run stopped.
    assert len(rows(tmp_path / "r" / "metrics.csv")) == 1 + 3
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and "round 3" in summary["error"]


def test_fewer_clients_than_the_budget_are_allowed_and_recorded(tmp_path):
    class Two:
        def select(self, ctx):
            return ctx.available[:2]

    res = fedsel.run(BASE, selector=Two(), out=tmp_path / "r")
    assert res.metrics["n_selected"].tolist() == [2] * 12


def test_an_exception_in_observe_stops_the_run_with_its_traceback(tmp_path):
    class Fails(user_selectors.Uniform):
        def observe(self, feedback):
            if feedback.round == 4:
                raise ValueError("observe broke")

    with pytest.raises(fedsel.FedselError, match=r"round 4[\s\S]*observe\(\) raised[\s\S]*ValueError: observe broke"):
        fedsel.run(BASE, selector=Fails(), out=tmp_path / "r")
    assert len(rows(tmp_path / "r" / "metrics.csv")) == 1 + 4


def test_ctx_shows_the_clock_and_durations_only_with_a_system(tmp_path):
    plain = user_selectors.Timed()
    fedsel.run({**BASE, "rounds": 3}, selector=plain, out=tmp_path / "plain")
    assert plain.clock == [(0, None, False), (1, None, False), (2, None, False)]
    timed = user_selectors.Timed()
    res = fedsel.run({**BASE, "rounds": 3, "system.kind": "lognormal"}, selector=timed, out=tmp_path / "timed")
    starts = [c for _, c, _ in timed.clock]
    assert starts[0] == 0.0 and starts[1] > 0 and all(d for _, _, d in timed.clock)
    # A round starts when the last one ended on the clock.
    assert starts[2] == pytest.approx(res.metrics["clock_s"][1])


def test_a_query_outside_the_available_clients_is_refused(tmp_path):
    class Peeks:
        def select(self, ctx):
            gone = next(c for c in range(ctx.clients) if c not in set(ctx.available.tolist()))
            ctx.query.losses([gone])

    with pytest.raises(fedsel.FedselError, match=r"asked client \d+ for a report, but it is not available"):
        fedsel.run({**BASE, "availability.kind": "scarce"}, selector=Peeks(), out=tmp_path / "r")


def test_a_sweep_mixes_builtin_and_python_strategies_in_parallel(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'name = "mixed"\nbaseline = "uniform"\n[config]\nrounds = 6\n[config.selection]\nclients_per_round = 5\n'
        '[axes]\nstrategy = ["uniform", "py:user_selectors:Uniform"]\nseed = [1, 2]\n'
    )
    out = tmp_path / "out"
    done = fedsel.sweep(sweep, out, jobs=2)
    assert done["ran"] == 4 and not done["failed"]
    cells = sorted(p for p in (out / "cells").iterdir() if p.is_dir())
    by_label = {}
    for cell in cells:
        cfg = (cell / "config.resolved.toml").read_text()
        seed = int(next(line.split("=")[1] for line in cfg.splitlines() if line.startswith("seed")))
        by_label.setdefault(seed, []).append(cell)
    for seed, pair in by_label.items():
        assert len(pair) == 2
        same_run(pair[0], pair[1])
    report = (out / "report.md").read_text()
    assert "py:user_selectors:Uniform" in report
    # Cells handed to other processes (as Ray's workers take them) import the class there.
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        spread = fedsel.sweep(sweep, tmp_path / "spread", executor=pool)
    assert spread["ran"] == 4
    for cell in cells:
        same_run(cell, tmp_path / "spread" / "cells" / cell.name)


def test_the_packages_fedsel_command_runs_a_py_strategy_from_the_working_directory(tmp_path):
    script = Path(sys.executable).parent / "fedsel"
    if not script.exists():
        pytest.skip(f"the package's `fedsel` script is not at {script}")
    (tmp_path / "mine.py").write_text((HERE / "user_selectors.py").read_text())
    done = subprocess.run(
        [script, "run", "--set", "rounds=3", "--set", 'selection.strategy="py:mine:Uniform"', "--out", "r"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["strategy"] == "py:mine:Uniform"


def test_the_rust_only_cli_says_how_to_get_python(tmp_path, cli):
    done = subprocess.run(
        [cli, "run", "--set", 'selection.strategy="py:mine:Uniform"', "--out", tmp_path / "r"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "selector written in Python" in done.stderr and "pip install" in done.stderr, done.stderr


def test_a_bad_class_name_or_constructor_is_a_config_error(tmp_path):
    with pytest.raises(fedsel.FedselError, match="cannot import module `no_such_module`"):
        fedsel.run({**BASE, "selection.strategy": "py:no_such_module:X"}, out=tmp_path / "a")
    with pytest.raises(fedsel.FedselError, match="module `user_selectors` has no `Nope`"):
        fedsel.run({**BASE, "selection.strategy": "py:user_selectors:Nope"}, out=tmp_path / "b")
    with pytest.raises(fedsel.FedselError, match=r"selection\.params[\s\S]*unexpected keyword argument 'dd'"):
        fedsel.run({**BASE, "selection.strategy": "py:fedsel.selectors:PowD", "selection.params": {"dd": 3}}, out=tmp_path / "c")


def test_fedsel_selector_drives_a_python_class_with_the_users_own_clients():
    s = fedsel.Selector(user_selectors.LossGreedy(explore=0.0), sizes=[10] * 6, per_round=2, rounds=3)
    assert s.strategy == "py:user_selectors:LossGreedy"

    class NoQuery:
        pass

    first = s.select(0, list(range(6)), 2, NoQuery())
    assert len(first) == 2 and len(set(first)) == 2
    s.observe(first, train_losses=[5.0, 1.0])
    second = s.select(1, list(range(6)), 2, NoQuery())
    assert first[0] in second  # the highest loss heard is chosen again
    named = fedsel.Selector("py:fedsel.selectors:PowD", sizes=[10] * 6, per_round=2, rounds=3, d=3)
    assert named.strategy == "py:fedsel.selectors:PowD"
