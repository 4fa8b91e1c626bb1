"""fedsel's Oort against FedScale 1.0's own (scripts/reference/oort_fedscale.py).

The reference wheel is downloaded from PyPI at test time; without it (no network) the test
is skipped, saying why. The selection frequencies over 30 seeds must lie as close to
FedScale's as FedScale's own lie to themselves on other seeds (within 1.5x).
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


# Not met yet, and kept visible rather than loosened: on federation 1 fedsel's distance to
# FedScale is 0.113 against FedScale's own seed-to-seed 0.049, even with registered
# durations. The first difference found: once no client is left unexplored, FedScale's
# getTopK keeps returning its previous round's exploration list (it resets it only while
# something is left to explore), so it returns fewer than K distinct clients in most
# rounds, which fedsel's contract of K_t clients does not do. Strict: the day the two
# agree, this marker fails and goes.
@pytest.mark.xfail(strict=True, reason="fedsel's Oort vs FedScale's: TV 0.113 against FedScale's own 0.049 (federation 1); cause under study")
@pytest.mark.parametrize("federation", [1, 2])
def test_selection_frequencies_are_within_fedscale_s_own_seed_spread(fedscale_oort, federation):
    r = ref.compare(fedscale_oort, federation, seeds=30, rounds=120, k=10, overcommit=0.0, registration=True)
    assert r["tv_fedsel"] <= 1.5 * r["tv_reference"], r
