"""fedsel from Python: run the simulator, sweep, report, and drive a selector yourself.

Every selector and every run is the Rust core's; this package only adapts its inputs and
outputs to Python (dicts, NumPy arrays, exceptions), so a run from here writes the same
files as ``fedsel run`` for the same config and seed.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import _fedsel
from ._fedsel import FedselError
from ._fedsel import Selector

__all__ = [
    "FedselError",
    "RunResult",
    "Selector",
    "__version__",
    "partition",
    "read_metrics",
    "report",
    "run",
    "sweep",
]

__version__: str = _fedsel.VERSION


def _display(progress: bool | None) -> str:
    """Bars only on a terminal: a notebook's or a service's logs stay clean unless asked.

    ``progress=True`` off a terminal prints a line every tenth of the run to ``sys.stderr``,
    which a notebook shows, instead of a bar that only a terminal can redraw.
    """
    tty = sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    if progress is False:
        return "off"
    if tty:
        return "bar"
    return "lines" if progress else "off"


def _config_source(config: Any) -> dict[str, Any]:
    """Which of path, TOML text or dict ``config`` is, as the keyword the core takes."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return {"table": dict(config)}
    if isinstance(config, os.PathLike):
        return {"path": os.fspath(config)}
    if isinstance(config, str):
        # A one-line string naming a file is a path; anything else is TOML text (a TOML
        # document that is a single bare word is not a config anyway).
        if "\n" not in config and "=" not in config:
            return {"path": config}
        return {"text": config}
    raise TypeError(f"config must be a path, a TOML string or a dict, not {type(config).__name__}")


def _overrides(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``--set`` strings from a dict ``{"train.lr": 0.1}`` or a list ``["train.lr=0.1"]``."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={_toml_value(v)}" for k, v in overrides.items()]
    return [str(o) for o in overrides]


def _toml_value(v: Any) -> str:
    """A Python value as the TOML text ``--set`` parses."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


class RunResult:
    """What a run left: its summary, its per-round metrics and where its files are."""

    def __init__(self, out_dir: Path, warnings: list[str]):
        self.out_dir = out_dir
        self.warnings = warnings
        self.summary: dict[str, Any] = json.loads((out_dir / "summary.json").read_text())
        self.metrics: dict[str, np.ndarray] = read_metrics(out_dir / "metrics.csv")

    def to_pandas(self):
        """The per-round metrics as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.metrics)

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"RunResult({s.get('strategy')}, {s.get('rounds')} rounds, "
            f"final_acc={s.get('final_acc')}, out_dir='{self.out_dir}')"
        )


def read_metrics(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A run's ``metrics.csv`` as one NumPy array per column; an empty cell is NaN."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    columns: dict[str, np.ndarray] = {}
    for i, name in enumerate(header):
        cells = [r[i] for r in body]
        if all(c.lstrip("-").isdigit() for c in cells):
            columns[name] = np.array([int(c) for c in cells], dtype=np.int64)
        else:
            columns[name] = np.array([float(c) if c else np.nan for c in cells], dtype=np.float64)
    return columns


def run(
    config: str | os.PathLike | Mapping[str, Any] | None = None,
    *,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    out: str | os.PathLike | None = None,
    data_dir: str | os.PathLike | None = None,
    progress: bool | None = None,
    overwrite: bool = False,
    resume: bool = False,
    on_round: Callable[[dict[str, Any]], Any] | None = None,
    selector: Any = None,
) -> RunResult:
    """Runs one experiment, as ``fedsel run`` does, and returns its result.

    ``config`` is a path to a TOML file, a TOML string, or a dict of config keys laid over
    the built-in default (nested dicts or dotted keys: ``{"train": {"lr": 0.1}}`` or
    ``{"train.lr": 0.1}``); ``None`` is the built-in default. ``overrides`` are the CLI's
    ``--set`` (a dict or ``"key=value"`` strings), applied after the config. ``out``
    defaults to the CLI's ``runs/<name>-s<seed>-<hash>``; a directory holding another run is
    refused unless ``overwrite`` (which clears it first) or ``resume``.

    ``resume=True`` makes the call safe to repeat: with no run in ``out`` it starts one;
    with an unfinished run of this config (interrupted, killed) it continues it from its
    last checkpoint, as ``fedsel run --resume`` does; with a finished one it returns that
    run without running anything (its ``warnings`` are then empty). A run of another
    config in ``out`` is refused.

    The GIL is released while the rounds run. Ctrl-C stops the run after the round in
    progress, which is written, and raises ``KeyboardInterrupt``; ``summary.json`` then
    says the run was interrupted. Any other failure raises :class:`FedselError` with the
    CLI's message.

    ``on_round`` is called after each round, once its row is written, with that round's
    ``metrics.csv`` row as a dict (column -> value; ``None`` for an empty cell, counts as
    ``int``): an experiment tracker's hook (:mod:`fedsel.integrations` has Weights & Biases
    and MLflow ones). It holds the GIL only while it runs. An exception it raises stops the
    run after that round, which is kept (``summary.json`` says it was interrupted; ``resume=True``
    continues it), and is raised here.

    ``selector`` is a selector object written in Python (a class with ``select(self, ctx)``;
    docs/your-selector.md) that chooses the clients in place of the config's strategy. The
    run is named by its class (``selection.strategy = "py:module:Class"`` in the resolved
    config), and the object's own arguments are not in the config: give them in
    ``[selection.params]`` too, or a distinct ``out``, to keep two settings' runs apart.
    """
    sets = _overrides(overrides)
    if selector is not None:
        sets.append(f"selection.strategy={json.dumps(_fedsel.class_path(selector))}")
    out_dir, found = _fedsel.run(
        **_config_source(config),
        overrides=sets,
        out=None if out is None else os.fspath(out),
        data_dir=None if data_dir is None else os.fspath(data_dir),
        progress=_display(progress),
        overwrite=overwrite,
        resume=resume,
        on_round=on_round,
        selector=selector,
    )
    for w in found:
        warnings.warn(w, stacklevel=2)
    return RunResult(Path(out_dir), found)


def sweep(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    jobs: int | None = None,
    data_dir: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    rounds: int | None = None,
    progress: bool | None = None,
    executor: Any = None,
    threads: int = 1,
    keep_going: bool = False,
) -> dict[str, Any]:
    """Runs every unfinished cell of a sweep file and writes its report (``fedsel sweep``).

    ``executor`` spreads the cells over other processes or machines: ``"ray"`` runs each
    cell as a Ray task (``pip install 'fedsel[ray]'``; it joins the cluster ``ray.init()``
    finds, or starts a local one), and any object with a ``map(fn, iterable)`` method (a
    ``concurrent.futures`` executor, a Ray ``multiprocessing.Pool``) is used as given. Each
    cell runs on ``threads`` threads through the same core as a local sweep, so its metrics
    are the same; the sweep file, ``out`` and the data must be at the same paths on every
    worker. Without ``executor`` the cells run here, ``jobs`` at a time.

    A local sweep stops starting cells when the first two cells it runs both fail with
    the same config or data error (a missing dataset fails every cell alike), as
    ``fedsel sweep`` does; ``keep_going=True`` runs every cell regardless. An ``executor``
    hands out every cell at once, so it always runs them all.

    Returns the counts (``total``, ``skipped``, ``ran``), the ``failed`` cells with their
    errors, and the ``report`` path. Raises :class:`FedselError` if any cell failed, after
    the report of the others is written, as the CLI exits non-zero.
    """
    sets = _overrides(overrides) + ([f"rounds={rounds}"] if rounds is not None else [])
    data = None if data_dir is None else os.fspath(data_dir)
    if executor is None:
        total, skipped, ran, failed, stopped, not_run = _fedsel.sweep(
            os.fspath(path),
            os.fspath(out),
            jobs=jobs,
            data_dir=data,
            overrides=sets,
            progress=_display(progress) == "bar",
            keep_going=keep_going,
        )
        if stopped is not None:
            raise FedselError(
                "the sweep stopped: the first two cells it ran failed with the same error, "
                f"so {not_run} cells were not started (keep_going=True runs them): {stopped}"
            )
    else:
        total, skipped, ran, failed = _sweep_on(
            executor, os.fspath(path), os.fspath(out), sets, data, threads
        )
    if failed:
        lines = "; ".join(f"{label}: {err}" for label, err in failed)
        raise FedselError(f"{len(failed)} cells failed: {lines}")
    return {
        "total": total,
        "skipped": skipped,
        "ran": ran,
        "failed": failed,
        "report": Path(out) / "report.md",
    }


def _run_cell(task: tuple[str, str, str, str, list[str], str | None, int]) -> tuple[str, str, str | None]:
    """One cell on a worker: (label, "ran" / "finished" / "busy" / "failed", error)."""
    label, path, out, dir_name, sets, data_dir, threads = task
    try:
        state = _fedsel.sweep_cell(
            path, out, dir_name, overrides=sets, data_dir=data_dir, threads=threads
        )
    except FedselError as e:
        return label, "failed", str(e)
    return label, state, None


def _sweep_on(
    executor: Any,
    path: str,
    out: str,
    sets: list[str],
    data_dir: str | None,
    threads: int,
) -> tuple[int, int, int, list[tuple[str, str]]]:
    """Runs a sweep's cells through ``executor`` and writes the report here."""
    cells = _fedsel.sweep_prepare(path, out, overrides=sets)
    tasks = [(label, path, out, d, sets, data_dir, threads) for label, d in cells]
    if executor == "ray":
        try:
            import ray
        except ImportError as e:
            raise FedselError(
                "executor='ray' needs Ray: pip install 'fedsel[ray]' (or 'ray')"
            ) from e
        if not ray.is_initialized():
            ray.init()
        remote = ray.remote(num_cpus=threads)(_run_cell)
        results = ray.get([remote.remote(t) for t in tasks])
    elif hasattr(executor, "map"):
        results = list(executor.map(_run_cell, tasks))
    else:
        raise FedselError(
            f"executor={executor!r}: use \"ray\" or an object with a map(fn, iterable) method"
        )
    states = [state for _, state, _ in results]
    failed = [(label, err) for label, state, err in results if state == "failed"]
    busy = [label for label, state, _ in results if state == "busy"]
    if busy:
        raise FedselError(
            f"{len(busy)} cells were running in another process (another sweep into {out}?): "
            + ", ".join(busy)
        )
    _fedsel.report(out)
    return len(cells), states.count("finished"), states.count("ran"), failed


def report(dir: str | os.PathLike, *, smooth: int | None = None) -> str:
    """Writes ``report.md`` and the table CSVs of a sweep directory; returns the report."""
    return _fedsel.report(os.fspath(dir), smooth=smooth)


def partition(
    config: str | os.PathLike | Mapping[str, Any] | None = None,
    *,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
) -> list[dict[str, np.ndarray]]:
    """Each client's example indices as fedsel partitions the config's dataset.

    Returns one dict per client with ``train`` and ``holdout`` index arrays into the
    dataset's training split in its file order, so that code outside fedsel (a Flower
    ClientApp) trains on exactly the clients a fedsel run would.
    """
    parts = _fedsel.partition(
        **_config_source(config),
        overrides=_overrides(overrides),
        data_dir=None if data_dir is None else os.fspath(data_dir),
    )
    return [
        {"train": np.asarray(t, dtype=np.int64), "holdout": np.asarray(h, dtype=np.int64)}
        for t, h in parts
    ]
