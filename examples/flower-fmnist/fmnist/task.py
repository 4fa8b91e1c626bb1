"""The model, the data and the training both apps share.

The model is softmax regression in NumPy (no deep-learning framework to install); its
arrays are `weight` (10 x 784) and `bias` (10), the names by which fedsel's strategies
find the output layer (a 1-D `bias` beside a 2-D `weight`). Each node trains on the
partition fedsel makes of the local Fashion-MNIST files for the same config and seed, read
from the IDX files; nothing is downloaded.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord

import fedsel

CLASSES, PIXELS = 10, 28 * 28
MEAN, STD = 0.1307, 0.3081


def data_dir(configured: str) -> Path:
    """The run config's directory, else $FEDSEL_DATA, else fedsel's default."""
    if configured:
        return Path(configured)
    if os.environ.get("FEDSEL_DATA"):
        return Path(os.environ["FEDSEL_DATA"])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "fedsel"


def _idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _file(root: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (root / "fashion-mnist" / name).is_file():
            return root / "fashion-mnist" / name
    raise FileNotFoundError(f"{stem}(.gz) not found under {root / 'fashion-mnist'}")


def normalise(x: np.ndarray) -> np.ndarray:
    """Pixels as fedsel normalises them."""
    return (x.astype(np.float32) / 255.0 - MEAN) / STD


@lru_cache(maxsize=2)
def _raw(root: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    x = _idx(_file(Path(root), f"{name}-images-idx3-ubyte")).reshape(-1, PIXELS)
    y = _idx(_file(Path(root), f"{name}-labels-idx1-ubyte")).astype(np.int64)
    return x, y


def split(root: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Normalised images, and labels, of `train` or `t10k`."""
    x, y = _raw(root, name)
    return normalise(x), y


@lru_cache(maxsize=4)
def partitions(root: str, clients: int, shards: int, seed: int) -> list[dict[str, np.ndarray]]:
    """fedsel's partition of Fashion-MNIST: every node's train and held-out indices."""
    return fedsel.partition(
        {
            "seed": seed,
            "dataset": {"kind": "fmnist"},
            "partition": {"clients": clients, "scheme": {"kind": "shards", "shards_per_client": shards}},
        },
        data_dir=root,
    )


def node_data(root: str, clients: int, shards: int, seed: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Node k's training images and labels, then its held-out ones, normalised.

    In a deployment each message starts a new ClientApp process, so reading and partitioning
    the whole training set for every message would cost most of a message's CPU time. The
    node's own examples are therefore kept, as bytes, in the system's temporary directory
    after the first message, under a name that covers the data files (path, size, time) and
    the partition's parameters.
    """
    files = [_file(Path(root), f"train-{kind}-idx{d}-ubyte") for kind, d in (("images", 3), ("labels", 1))]
    key = repr([str(f.resolve()) for f in files] + [(f.stat().st_size, f.stat().st_mtime_ns) for f in files] + [clients, shards, seed, k])
    cache = Path(tempfile.gettempdir()) / "fedsel-flower-fmnist" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"
    if not cache.is_file():
        part = partitions(root, clients, shards, seed)[k]
        x, y = _raw(root, "train")
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.npz")
        np.savez(tmp, x=x[part["train"]], y=y[part["train"]], hx=x[part["holdout"]], hy=y[part["holdout"]])
        os.replace(tmp, cache)
    with np.load(cache) as z:
        return normalise(z["x"]), z["y"], normalise(z["hx"]), z["hy"]


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """A Flower ArrayRecord of the arrays, keeping their names and order."""
    return ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def init_arrays() -> dict[str, np.ndarray]:
    return {"weight": np.zeros((CLASSES, PIXELS), np.float32), "bias": np.zeros(CLASSES, np.float32)}


def loss_acc(arrays: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    logits = x @ arrays["weight"].T + arrays["bias"]
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean()), float((logits.argmax(axis=1) == y).mean())


def train(arrays: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, steps: int, batch: int, lr: float, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], float]:
    """Mini-batch SGD on the cross-entropy; returns the local model and its mean loss."""
    w, b = arrays["weight"].copy(), arrays["bias"].copy()
    losses = []
    for _ in range(steps):
        i = rng.choice(len(y), size=min(batch, len(y)), replace=False)
        logits = x[i] @ w.T + b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(len(i)), y[i]] + 1e-12).mean()))
        p[np.arange(len(i)), y[i]] -= 1.0
        p /= len(i)
        w -= lr * (p.T @ x[i])
        b -= lr * p.sum(axis=0)
    return {"weight": w, "bias": b}, float(np.mean(losses))
