"""The model, the data and the training both apps share.

The model is a small CNN in PyTorch, sized for CPUs: two 5x5 convolutions with max
pooling, then two linear layers, `fc2` being the output layer. Its state dict travels as
a Flower ArrayRecord under the state dict's own keys, which is how fedsel's strategies find
the output layer (the last `<name>.bias` whose `<name>.weight` is 2-D: `fc2`). Each node
trains on the partition fedsel makes of the local Fashion-MNIST files for the same config
and seed, read from the IDX files; nothing is downloaded.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import fedsel

CLASSES, SIDE = 10, 28
MEAN, STD = 0.1307, 0.3081


class Net(nn.Module):
    """Two convolutions and a linear head: about 21,000 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5)
        self.conv2 = nn.Conv2d(8, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def model(state: dict[str, torch.Tensor] | None = None, seed: int = 0) -> Net:
    """The CNN with the given weights, else freshly initialised from `seed`. One thread:
    a simulation runs its nodes side by side on the machine's cores."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    net = Net()
    if state is not None:
        net.load_state_dict(state)
    return net


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


def images(x: np.ndarray) -> torch.Tensor:
    """Pixels as fedsel normalises them, shaped (N, 1, 28, 28) for the CNN."""
    return torch.from_numpy((x.astype(np.float32) / 255.0 - MEAN) / STD).reshape(-1, 1, SIDE, SIDE)


@lru_cache(maxsize=2)
def _raw(root: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    x = _idx(_file(Path(root), f"{name}-images-idx3-ubyte"))
    y = _idx(_file(Path(root), f"{name}-labels-idx1-ubyte")).astype(np.int64)
    return x, y


def split(root: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels of `train` or `t10k`."""
    x, y = _raw(root, name)
    return images(x), torch.from_numpy(y)


def node_data(root: str, clients: int, shards: int, seed: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Node k's training images and labels, then its held-out ones.

    In a deployment each message starts a new ClientApp process, so reading and partitioning
    the whole training set for every message would cost most of a message's CPU time. The
    node's own examples are therefore kept, as bytes, in the system's temporary directory
    after the first message, under a name that covers the data files (path, size, time) and
    the partition's parameters.
    """
    files = [_file(Path(root), f"train-{kind}-idx{d}-ubyte") for kind, d in (("images", 3), ("labels", 1))]
    key = repr([str(f.resolve()) for f in files] + [(f.stat().st_size, f.stat().st_mtime_ns) for f in files] + [clients, shards, seed, k])
    cache = Path(tempfile.gettempdir()) / "fedsel-flower-pytorch" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"
    if not cache.is_file():
        part = fedsel.partition(
            {
                "seed": seed,
                "dataset": {"kind": "fmnist"},
                "partition": {"clients": clients, "scheme": {"kind": "shards", "shards_per_client": shards}},
            },
            data_dir=root,
        )[k]
        x, y = _raw(root, "train")
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.npz")
        np.savez(tmp, x=x[part["train"]], y=y[part["train"]], hx=x[part["holdout"]], hy=y[part["holdout"]])
        os.replace(tmp, cache)
    with np.load(cache) as z:
        return images(z["x"]), torch.from_numpy(z["y"]), images(z["hx"]), torch.from_numpy(z["hy"])


@torch.no_grad()
def loss_acc(net: Net, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy and accuracy, in batches to bound memory."""
    net.eval()
    loss, correct = 0.0, 0
    for xb, yb in zip(x.split(1000), y.split(1000)):
        logits = net(xb)
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return loss / len(y), correct / len(y)


def train(net: Net, x: torch.Tensor, y: torch.Tensor, steps: int, batch: int, lr: float, rng: np.random.Generator) -> float:
    """Mini-batch SGD on the cross-entropy, in place; returns the mean loss."""
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        i = torch.from_numpy(rng.choice(len(y), size=min(batch, len(y)), replace=False))
        opt.zero_grad()
        loss = F.cross_entropy(net(x[i]), y[i])
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return float(np.mean(losses))
