"""PyTorch reference for fedsel's CNN training steps and test-set evaluation (issue 12).

The models of crates/fedsel/src/model/cnn_fmnist.rs and cnn_cifar.rs:
  cnn_fmnist: conv5x5(1->32,pad2)-relu-pool2-conv5x5(32->64,pad2)-relu-pool2-fc3136->512-relu-fc512->10, batch 64
  cnn_hics:   the same convolutions, one fc3136->10, batch 64
  cnn_cifar:  conv3x3(3->32)-pool-relu-conv3x3(32->64)-pool-relu-conv3x3(64->64)-relu-fc1024->64-relu-fc64->10, batch 50
One step is what fedsel's trainer does: forward, mean cross-entropy, backward, plain SGD
update; the median over REPS timed steps after a warm-up. Evaluation is a forward pass
under no_grad over 10,000 random examples in batches of 1000 (fedsel's eval.batch_size)
with the summed loss and the correct count, as fedsel's `evaluate`; the median over
EVAL_REPS passes; --steps-only skips it (printing eval10k_ms=nan), --only NAME times the
models whose name contains NAME (as `fedsel bench --only`).

Usage: python bench/torch_cnn.py [--threads N] [--reps R] [--eval-reps E] [--only NAME] [--steps-only]
"""
import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F


def models():
    conv = lambda: [nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()]
    yield "cnn_fmnist", nn.Sequential(*conv(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10)), (1, 28, 28), 64
    yield "cnn_hics", nn.Sequential(*conv(), nn.Linear(3136, 10)), (1, 28, 28), 64
    yield "cnn_cifar", nn.Sequential(nn.Conv2d(3, 32, 3), nn.MaxPool2d(2), nn.ReLU(),
                                     nn.Conv2d(32, 64, 3), nn.MaxPool2d(2), nn.ReLU(),
                                     nn.Conv2d(64, 64, 3), nn.ReLU(), nn.Flatten(),
                                     nn.Linear(1024, 64), nn.ReLU(), nn.Linear(64, 10)), (3, 32, 32), 50


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--eval-reps", type=int, default=3)
    ap.add_argument("--only", metavar="NAME", default="")
    ap.add_argument("--steps-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    for name, m, shape, batch in models():
        if args.only not in name:
            continue
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        x, y = torch.rand(batch, *shape), torch.randint(10, (batch,))
        times = []
        for i in range(args.reps + 5):
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
            opt.step()
            if i >= 5:
                times.append(time.perf_counter() - t)
        step = 1000 * statistics.median(times)
        if args.steps_only:
            print(f"{name} threads={args.threads} step_ms={step:.2f} eval10k_ms=nan")
            continue
        tx, ty = torch.rand(10_000, *shape), torch.randint(10, (10_000,))
        times = []
        with torch.no_grad():
            for i in range(args.eval_reps + 1):
                t = time.perf_counter()
                loss, correct = 0.0, 0
                for lo in range(0, 10_000, 1000):
                    logits = m(tx[lo:lo + 1000])
                    loss += F.cross_entropy(logits, ty[lo:lo + 1000], reduction="sum").item()
                    correct += (logits.argmax(1) == ty[lo:lo + 1000]).sum().item()
                if i >= 1:
                    times.append(time.perf_counter() - t)
        ev = 1000 * statistics.median(times)
        print(f"{name} threads={args.threads} step_ms={step:.2f} eval10k_ms={ev:.1f}")


if __name__ == "__main__":
    main()
