"""fedsel's Oort against FedScale 1.0's own (scripts/reference/oort_fedscale.py).

The reference wheel is downloaded from PyPI at test time; without it (no network) the test
is skipped, saying why. The selection frequencies over 30 seeds must lie as close to
FedScale's (given fedsel's deliberate departures) as FedScale's own lie to themselves on
other seeds (within 1.5x).
"""

import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "reference"))

import oort_fedscale as ref  # noqa: E402


@pytest.fixture(scope="module")
def fedscale_oort():
    with tempfile.TemporaryDirectory() as tmp:
        try:
            yield ref.load_fedscale_oort(Path(tmp))
        except ref.Unavailable as e:
            print(f"skipped: {e}")
            pytest.skip(str(e))


# The fair comparison gives FedScale fedsel's deliberate departures (its first round
# explored by the prior, no stale exploration list once every client was tried, K distinct
# clients a round, stragglers' durations as censored bounds; the driver's docstring and select/oort.rs
# say why): federation 1 then lies at 0.018 against FedScale's own 0.020, where FedScale as
# it is lies at 0.112 against its own 0.049.
@pytest.mark.parametrize("federation", [1, 2])
def test_selection_frequencies_are_within_fedscale_s_own_seed_spread(fedscale_oort, federation):
    r = ref.compare(fedscale_oort, federation, seeds=30, rounds=120, k=10, overcommit=0.0, registration=True)
    assert r["tv_fedsel"] <= 1.5 * r["tv_reference"], r
    # The slowest fifth's share of the picks, the figure the departures moved most.
    assert abs(r["slow_fedsel"] - r["slow_fedscale"]) < 0.01, r


def test_over_commitment_agrees_once_fedscale_is_given_fedsel_s_straggler_rule(fedscale_oort):
    r = ref.compare(fedscale_oort, 1, seeds=30, rounds=120, k=10, overcommit=0.3, registration=True)
    assert r["tv_fedsel"] <= 1.5 * r["tv_reference"], r


def test_a_dropped_straggler_counts_as_tried_as_fedscale_registers_it(fedscale_oort):
    # FedScale registering each dropped straggler as it does (a trial with the round's mean
    # utility and its exact duration): the slowest fifth of the clients gets about as many of
    # fedsel's picks as of FedScale's (6.4 % each; 27.1 % in fedsel when a straggler stayed
    # untried and was explored again).
    given = ref.DEPARTURES - {"stragglers"}
    r = ref.compare(fedscale_oort, 1, seeds=30, rounds=120, k=10, overcommit=0.3, registration=True, departures=given)
    assert r["slow_fedscale"] / 2 <= r["slow_fedsel"] <= 2 * r["slow_fedscale"], r
    assert r["tv_fedsel"] <= 1.5 * r["tv_reference"], r


def test_fedscale_as_it_is_differs_by_the_departures_alone(fedscale_oort):
    # Against FedScale as it is the distance is about twice its own: the effect of the
    # departures, which the tests above remove.
    r = ref.compare(fedscale_oort, 1, seeds=30, rounds=120, k=10, overcommit=0.0, registration=True, departures=frozenset())
    assert r["tv_fedsel"] > 1.5 * r["tv_reference"], r
    assert r["short_rounds"] > 0, r
