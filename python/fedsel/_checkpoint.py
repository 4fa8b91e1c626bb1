"""Checkpoints of a :class:`~fedsel.flower.FedselStrategy`: what a restarted ServerApp
needs to go on where the last one stopped.

One file, ``<checkpoint_dir>/fedsel-checkpoint.npz``, holds the global arrays (under
``arrays/<name>``) and, as UTF-8 JSON in ``meta``, the strategy's config, the last round
done, the federation (node ids, their keys where ``node_key`` names them, their sizes), the
selector's ``state()``, the history and the ledger. It is replaced atomically: written to a
temporary file in the same directory, flushed and fsynced, renamed over the old one, and
the directory fsynced, so a server killed at any moment leaves either the old checkpoint
or the new one, never half of one.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import FedselError

FILE = "fedsel-checkpoint.npz"
FORMAT = 1
_ARRAY = "arrays/"


def config(strategy: Any, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """What a checkpoint must agree on with the strategy that loads it: the fedsel
    strategy, its options, the run's length, seed and budget, how nodes are named across
    restarts, and the model's arrays (names, shapes, dtypes)."""
    return {
        "strategy": strategy.strategy,
        "options": json.loads(json.dumps(strategy.options, sort_keys=True)),
        "per_round": strategy.per_round,
        "num_rounds": strategy.num_rounds,
        "seed": strategy.seed,
        "output_keys": list(strategy.output_keys) if strategy.output_keys is not None else None,
        "node_key": strategy.node_key,
        "arrays": {k: [list(v.shape), v.dtype.str] for k, v in arrays.items()},
    }


def _history_to_json(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: ({str(n): x for n, x in v.items()} if isinstance(v, dict) and k in ("rejected", "durations") else v) for k, v in h.items()} for h in history]


def _history_from_json(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # JSON keys are strings; the history's by-node records are keyed by node id.
    return [{k: ({int(n): x for n, x in v.items()} if k in ("rejected", "durations") else v) for k, v in h.items()} for h in history]


def save(directory: str | os.PathLike, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
    """Atomically replaces the checkpoint in `directory` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "format": FORMAT, "history": _history_to_json(meta["history"])}
    text = json.dumps(meta, allow_nan=True).encode()
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(text, dtype=np.uint8), **{_ARRAY + k: np.ascontiguousarray(v) for k, v in arrays.items()})
    path = directory / FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load(directory: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The checkpoint in `directory` (meta, arrays), or None where there is none."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            arrays = {k[len(_ARRAY):]: z[k] for k in z.files if k.startswith(_ARRAY)}
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        raise FedselError(f"checkpoint {path} cannot be read: {e}") from None
    if meta.get("format") != FORMAT:
        raise FedselError(f"checkpoint {path} has format {meta.get('format')!r}, this fedsel reads {FORMAT}")
    meta["history"] = _history_from_json(meta["history"])
    return meta, arrays


def check(path: Path, saved: dict[str, Any], want: dict[str, Any]) -> None:
    """Refuses a checkpoint made with another config, naming every difference."""
    diffs = []
    for key in want:
        if key == "arrays":
            continue
        if saved.get(key) != want[key]:
            diffs.append(f"{key} {saved.get(key)!r} (this strategy's: {want[key]!r})")
    got, model = saved.get("arrays", {}), want["arrays"]
    for name in sorted(set(got) | set(model)):
        if name not in model:
            diffs.append(f"array `{name}` that the model does not have")
        elif name not in got:
            diffs.append(f"no array `{name}` (the model's: shape {tuple(model[name][0])}, dtype {model[name][1]})")
        elif got[name] != model[name]:
            diffs.append(f"array `{name}` of shape {tuple(got[name][0])}, dtype {got[name][1]} (the model's: shape {tuple(model[name][0])}, dtype {model[name][1]})")
    if diffs:
        raise FedselError(f"checkpoint {path} is from another run: it has " + "; ".join(diffs) + "; use another checkpoint_dir, or remove it to start afresh")
