"""PyTorch reference for fedsel's char-LSTM training step and evaluation (issue 12).

The model of crates/fedsel/src/model/lstm.rs: Embedding(80, 8), two LSTM layers of 256
units, a dense layer 256 -> 80 on the last time step; batch 10, sequence 80, random
tokens and labels. One step is what fedsel's trainer does: forward, mean cross-entropy,
backward, plain SGD update. Evaluation is what fedsel's server does on its test set:
10,000 sequences in batches of 500 (the Shakespeare configs' `eval.batch_size`), logits
without autograd, summed cross-entropy and correct count. Prints the median over REPS
timed steps and over EVAL_REPS timed evaluations, each after a warm-up.

Usage: python bench/torch_reference.py [--threads N] [--reps R] [--eval-reps E]
"""
import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, EMBED, HIDDEN, BATCH, SEQ = 80, 8, 256, 10, 80
EVAL_EXAMPLES, EVAL_BATCH = 10_000, 500


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


def eval_ms(threads, reps, warmup=1):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = CharLstm().eval()
    tokens = torch.randint(VOCAB, (EVAL_EXAMPLES, SEQ))
    labels = torch.randint(VOCAB, (EVAL_EXAMPLES,))
    times = []
    for rep in range(warmup + reps):
        started = time.perf_counter()
        loss, correct = 0.0, 0
        with torch.no_grad():
            for x, y in zip(tokens.split(EVAL_BATCH), labels.split(EVAL_BATCH)):
                logits = model(x)
                loss += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
        if rep >= warmup:
            times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--eval-reps", type=int, default=3)
    args = parser.parse_args()
    ms = step_ms(args.threads, args.reps)
    ev = eval_ms(args.threads, args.eval_reps) if args.eval_reps > 0 else float("nan")
    print(
        f"char_lstm torch={torch.__version__} threads={args.threads} "
        f"ms_per_step={ms:.2f} eval_ms={ev:.1f}"
    )


if __name__ == "__main__":
    main()
