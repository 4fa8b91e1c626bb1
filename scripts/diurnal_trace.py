#!/usr/bin/env python3
"""Writes a FedScale-format `client_behave_trace` with diurnal availability, seeded.

FedScale's trace (benchmark/dataset/data/device_info/client_behave_trace) is a pickled dict
`client_id -> {'duration', 'inactive', 'finish_time', 'active', 'model'}`: a client is
online during [active[i], inactive[i]] of every `finish_time` seconds. This script makes one
such entry per client from a day/night cycle, so that a run on the virtual clock meets the
availability pattern that motivates availability-aware selection: devices are idle, charging
and on Wi-Fi mostly at their local night, which falls at a different time for each client.

Per client k (its own random stream, keyed by the seed and k):
- a phase φ_k, uniform over the day: the middle of its local night;
- the probability of being online at time t of the day,
  p_k(t) = p_min + (p_max − p_min)·(1 + cos(2π(t − φ_k)/day))/2,
  highest at φ_k and lowest half a day later;
- alternating sessions from t = 0 (online with probability p_k(0)): an online session lasts
  Exp(mean `--session-s`); an offline gap started at t lasts Exp(mean
  session·(1 − p_k(t))/p_k(t)), so that the long-run share of time online at t is p_k(t);
- the last interval is cut at the end of the day (`finish_time` = day), and a client with no
  online session gets one of a session's mean length at its phase (FedScale's loader and
  fedsel's both need at least one interval).

`duration` is the total online time of the cycle and `model` the device model's name, as in
FedScale's file (fedsel reads only `active`, `inactive` and `finish_time`).

    python3 scripts/diurnal_trace.py --clients 100 --seed 1 --out configs/system/diurnal_behave_trace

Standard library only (pickle, random, math), so it runs wherever the repository does. The
keys are 1..clients in order, as in FedScale's files; fedsel's client k reads the entry at
position (k + 1) mod clients.
"""

import argparse
import math
import pickle
import random


def probability(t, phase, day, p_min, p_max):
    """p_k(t): the share of time a client is online around time t of its day."""
    return p_min + (p_max - p_min) * (1.0 + math.cos(2.0 * math.pi * (t - phase) / day)) / 2.0


def client_entry(rng, day, session, p_min, p_max):
    """One client's online intervals over a day."""
    phase = rng.uniform(0.0, day)
    active, inactive = [], []
    t = 0.0
    online = rng.random() < probability(0.0, phase, day, p_min, p_max)
    while t < day:
        if online:
            end = min(day, t + rng.expovariate(1.0 / session))
            active.append(t)
            inactive.append(end)
        else:
            p = probability(t, phase, day, p_min, p_max)
            end = t + rng.expovariate(p / (session * (1.0 - p)))
        t = end
        online = not online
    if not active:
        start = phase % day
        active, inactive = [start], [min(day, start + session)]
    return {
        "duration": sum(b - a for a, b in zip(active, inactive)),
        "inactive": inactive,
        "finish_time": day,
        "active": active,
        "model": "diurnal",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--day-s", type=float, default=86400.0, help="length of the cycle, seconds")
    ap.add_argument("--session-s", type=float, default=1800.0,
                    help="mean length of an online session, seconds")
    ap.add_argument("--p-min", type=float, default=0.05, help="share online at local noon")
    ap.add_argument("--p-max", type=float, default=0.8, help="share online at local midnight")
    args = ap.parse_args()
    if args.clients < 1:
        ap.error("--clients must be ≥ 1")
    if not (args.day_s > 0 and args.session_s > 0):
        ap.error("--day-s and --session-s must be > 0")
    if not (0.0 < args.p_min <= args.p_max < 1.0):
        ap.error("need 0 < --p-min ≤ --p-max < 1")
    trace = {}
    for k in range(1, args.clients + 1):
        rng = random.Random(f"{args.seed}/diurnal/{k}")
        trace[k] = client_entry(rng, args.day_s, args.session_s, args.p_min, args.p_max)
    with open(args.out, "wb") as f:
        pickle.dump(trace, f, protocol=4)
    share = sum(e["duration"] for e in trace.values()) / (args.clients * args.day_s)
    sessions = sum(len(e["active"]) for e in trace.values()) / args.clients
    print(f"{args.out}: {args.clients} clients, day {args.day_s:g} s, "
          f"{share:.3f} of client-time online, {sessions:.1f} sessions a client a day")


if __name__ == "__main__":
    main()
