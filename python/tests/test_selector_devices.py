"""`fedsel.Selector("pyramidfl", devices=...)`: device profiles in, per-client orders out.

Four clients download and upload in 1 s each and compute their 10 steps of batch 10 in 2,
4, 8 and 20 s. With K = 3 over-committed 1.34, PyramidFL's `code` protocol draws all four
in its uniform first round, runs the three of shortest round trip and orders them the
dropouts 0.4333, 0.1, 0.2667 (by gradient-utility rank) and 40, 18 and 10 steps (the
code's float32 ratio truncated: the hand computation is in
crates/fedsel/src/select/pyramidfl.rs's tests).
"""

import math

import pytest

import fedsel

SIZES = [100, 300, 200, 400]


def devices(compute=(2.0, 4.0, 8.0, 20.0)):
    return [
        dict(download_s=1.0, compute_s=c, upload_s=1.0, steps=10, epoch_steps=100, batch=10)
        for c in compute
    ]


def test_orders_give_each_selected_entry_its_work_and_dropout():
    sel = fedsel.Selector("pyramidfl", sizes=SIZES, per_round=3, rounds=4, seed=1, devices=devices(), overcommit=1.34)
    assert sel.orders is None
    chosen = sel.select(0, available=[0, 1, 2, 3], budget=3, query=None)
    assert chosen == [0, 1, 2]
    orders = sel.orders
    assert [math.floor(10 * w) for w, _ in orders] == [40, 18, 10]
    for (_, got), want in zip(orders, [0.1 + 1 / 3, 0.1, 0.1 + 1 / 6]):
        assert got == pytest.approx(want, abs=1e-6)
    sel.observe(chosen, train_losses=[0.5, 1.0, 2.0], updates=[[3.0, 4.0], [0.0, 1.0], [2.0, 0.0]])
    assert len(sel.select(1, available=[0, 1, 2, 3], budget=3, query=None)) == 3
    assert len(sel.orders) == 3


def test_without_dropout_the_orders_upload_whole():
    sel = fedsel.Selector(
        "pyramidfl", sizes=SIZES, per_round=2, rounds=2, devices=devices(), enable_dropout=False
    )
    sel.select(0, available=[0, 1, 2, 3], budget=2, query=None)
    assert all(d is None for _, d in sel.orders)


def test_a_strategy_without_orders_has_none():
    sel = fedsel.Selector("uniform", sizes=SIZES, per_round=2, rounds=2)
    sel.select(0, available=[0, 1, 2, 3], budget=2, query=None)
    assert sel.orders is None


def test_missing_or_malformed_devices_are_errors_naming_the_argument():
    with pytest.raises(fedsel.FedselError, match="`devices`"):
        fedsel.Selector("pyramidfl", sizes=SIZES, per_round=2, rounds=2)
    with pytest.raises(fedsel.FedselError, match=r"`devices` has 3 entries for 4 clients"):
        fedsel.Selector("pyramidfl", sizes=SIZES, per_round=2, rounds=2, devices=devices()[:3])
    bad = devices()
    del bad[2]["batch"]
    with pytest.raises(fedsel.FedselError, match=r"`devices\[2\]` has no `batch`"):
        fedsel.Selector("pyramidfl", sizes=SIZES, per_round=2, rounds=2, devices=bad)
    bad = devices()
    bad[1]["compute_s"] = -1.0
    with pytest.raises(fedsel.FedselError, match=r'`devices\[1\]\["compute_s"\]` is -1'):
        fedsel.Selector("pyramidfl", sizes=SIZES, per_round=2, rounds=2, devices=bad)
    bad = devices()
    bad[0]["speed"] = 1.0
    with pytest.raises(fedsel.FedselError, match=r"`devices\[0\]` has the key `speed`"):
        fedsel.Selector("pyramidfl", sizes=SIZES, per_round=2, rounds=2, devices=bad)


def test_a_partial_oort_table_keeps_pyramidfl_s_other_defaults():
    # Accepted (cut_off_util over PyramidFL's defaults) and unknown keys refused.
    fedsel.Selector("pyramidfl", sizes=SIZES, per_round=2, rounds=2, devices=devices(), oort={"cut_off_util": 0.5})
    with pytest.raises(fedsel.FedselError, match="cut_of_util"):
        fedsel.Selector("pyramidfl", sizes=SIZES, per_round=2, rounds=2, devices=devices(), oort={"cut_of_util": 0.5})
