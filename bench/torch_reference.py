"""PyTorch reference for fedsel's char-LSTM training step (issue 12).

The model of crates/fedsel/src/model/lstm.rs: Embedding(80, 8), two LSTM layers of 256
units, a dense layer 256 -> 80 on the last time step; batch 10, sequence 80, random
tokens and labels. One step is what fedsel's trainer does: forward, mean cross-entropy,
backward, plain SGD update. Prints the median over REPS timed steps after a warm-up.

Usage: python bench/torch_reference.py [--threads N] [--reps R]
"""
import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, EMBED, HIDDEN, BATCH, SEQ = 80, 8, 256, 10, 80


class CharLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.lstm = nn.LSTM(EMBED, HIDDEN, num_layers=2, batch_first=True)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        hidden, _ = self.lstm(self.embed(tokens))
        return self.out(hidden[:, -1])


def step_ms(threads, reps, warmup=5):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = CharLstm()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(VOCAB, (BATCH, SEQ))
    labels = torch.randint(VOCAB, (BATCH,))
    times = []
    for rep in range(warmup + reps):
        started = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(tokens), labels).backward()
        opt.step()
        if rep >= warmup:
            times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    ms = step_ms(args.threads, args.reps)
    print(f"char_lstm torch={torch.__version__} threads={args.threads} ms_per_step={ms:.2f}")


if __name__ == "__main__":
    main()
