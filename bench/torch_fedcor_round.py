"""PyTorch reference for fedsel's FedCor FMNIST round (issue 12).

The round `fedsel bench` times from configs/fedcor/fmnist_2spc_rand.toml: 100 clients holding
two label-sorted shards of 300 Fashion-MNIST images each, 5 drawn uniformly per round, each
running 20 SGD steps of batch 64 (lr 0.005, weight decay 1e-4) on the MLP 784-64-30-10 with
dropout 0.5 after each hidden layer, the plain average of the 5 models as the new global
model, then the loss and accuracy on the 10,000 test images. It is written as a careful user
would: tensors in memory, no DataLoader, one reusable local model. Prints milliseconds per
round, the median over rounds after a warm-up.

Usage: python bench/torch_fedcor_round.py FMNIST_DIR [--rounds R] [--threads N]
"""
import argparse
import gzip
import statistics
import struct
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def read_idx(path):
    raw = gzip.open(path, "rb").read()
    dims = struct.unpack(">" + "I" * raw[3], raw[4:4 + 4 * raw[3]])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(dims)


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(64, 30), nn.ReLU(), nn.Dropout(0.5), nn.Linear(30, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fmnist_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    rng = np.random.default_rng(1)

    def images(name):
        x = torch.tensor(read_idx(args.fmnist_dir / name), dtype=torch.float32) / 255.0
        return ((x - 0.2860) / 0.3530).reshape(-1, 784)

    xtr, xte = images("train-images-idx3-ubyte.gz"), images("t10k-images-idx3-ubyte.gz")
    ytr = torch.tensor(read_idx(args.fmnist_dir / "train-labels-idx1-ubyte.gz").astype(np.int64))
    yte = torch.tensor(read_idx(args.fmnist_dir / "t10k-labels-idx1-ubyte.gz").astype(np.int64))
    shards = np.argsort(ytr.numpy(), kind="stable").reshape(200, 300)[rng.permutation(200)]
    clients = [torch.tensor(np.concatenate(shards[2 * k:2 * k + 2])) for k in range(100)]

    global_model, local = mlp(), mlp()
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        start = {k: v.clone() for k, v in global_model.state_dict().items()}
        total = {k: torch.zeros_like(v) for k, v in start.items()}
        for c in rng.choice(100, 5, replace=False):
            local.load_state_dict(start)
            local.train()
            opt = torch.optim.SGD(local.parameters(), lr=0.005, weight_decay=1e-4)
            idx = clients[c]
            for _ in range(20):
                b = idx[torch.randint(len(idx), (64,))]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(local(xtr[b]), ytr[b]).backward()
                opt.step()
            for k, v in local.state_dict().items():
                total[k] += v / 5.0
        global_model.load_state_dict(total)
        global_model.eval()
        with torch.no_grad():
            logits = global_model(xte)
            F.cross_entropy(logits, yte, reduction="sum").item()
            (logits.argmax(1) == yte).sum().item()
        times.append(time.perf_counter() - t0)
    warm = times[min(5, len(times) - 1):]
    print(f"torch {torch.__version__} fedcor fmnist 2spc round, {args.threads} threads: "
          f"{statistics.median(warm) * 1e3:.1f} ms/round (median of {len(warm)})")


if __name__ == "__main__":
    main()
