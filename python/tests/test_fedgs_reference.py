"""fedsel's FedGS against the FedGS authors' own server (scripts/reference/fedgs_authors.py).

The reference is `algorithm/oracle_fedgs.py` of WwZzz/FedGS at the driver's commit: from
`FEDSEL_FEDGS_CHECKOUT` (a clone at that commit) if set, else cloned at test time; its
solver is gurobipy from PyPI (downloaded at test time, the size-limited license), or the
driver's exhaustive stand-in where gurobipy cannot be had. Without the checkout (no
network) the test is skipped, saying why.

FedGS draws nothing once the availability is fixed, so the agreement asked is exact: the
3DG's shortest paths to 1e-9 relative, and the same chosen set in every round (each round
from the same selection counts, and each side on its own), except where Gurobi stops
within its default relative MIP gap of 1e-4: there fedsel's set must be at least as good
under the authors' own objective, and within 1e-4. Solved exactly (the driver's
exhaustive stand-in for Gurobi) no round differs.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "reference"))

import fedgs_authors as ref  # noqa: E402

REPO = "https://github.com/WwZzz/FedGS"


def _clone(into: Path) -> Path:
    dest = into / "FedGS"
    try:
        subprocess.run(["git", "clone", "--quiet", REPO, str(dest)], check=True, capture_output=True, timeout=120)
        subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", ref.COMMIT], check=True, capture_output=True)
    except (subprocess.SubprocessError, OSError) as e:
        detail = getattr(e, "stderr", b"") or b""
        raise ref.Unavailable(f"git clone {REPO} failed: {detail.decode(errors='replace')[-300:] or e}") from e
    return dest


def _authors(tmp: Path, mipgap):
    given = os.environ.get("FEDSEL_FEDGS_CHECKOUT")
    checkout = Path(given) if given else _clone(tmp)
    try:
        solver = ref.load_gurobipy(tmp, mipgap)
    except ref.Unavailable as e:
        print(f"gurobipy unavailable ({e}): the exhaustive stand-in solves the authors' program")
        solver = ref.exact_solver()
    return ref.load_authors(checkout, solver)


@pytest.fixture(scope="module")
def reference():
    """The authors' module, loaded on demand per MIP gap (None: Gurobi's default)."""
    with tempfile.TemporaryDirectory() as tmp:
        loaded = {}

        def get(mipgap=None):
            if mipgap not in loaded:
                try:
                    loaded[mipgap] = _authors(Path(tmp) / str(mipgap), mipgap)
                except ref.Unavailable as e:
                    print(f"skipped: {e}")
                    pytest.skip(str(e))
            return loaded[mipgap]

        yield get


@pytest.mark.parametrize(("kind", "alpha"), [("synthetic", 1.0), ("labels", 0.1)])
def test_fedgs_chooses_the_authors_sets_or_better_within_gurobi_s_gap(reference, kind, alpha):
    """As the authors ran it (Gurobi's default relative MIP gap 1e-4): every round the
    same set, or a set whose authors' objective is at least theirs and within 1e-4 of it."""
    r = ref.compare(reference(), kind, n=20, k=4, alpha=alpha, seeds=30, rounds=5, spread=False)
    print(ref.report(r))
    assert r["h_rel"] <= 1e-9, r["h_rel"]
    assert all(-1e-12 <= g <= 1e-4 for g in r["gaps"]), r["diffs"][:5]
    assert r["equal_lockstep"] >= 0.9 * r["rounds"], r["diffs"][:5]


def test_fedgs_chooses_the_authors_sets_when_their_program_is_solved_exactly(reference):
    """The authors' program (their graph, Ht and constraint) solved by the driver's
    exhaustive stand-in for Gurobi: the same set every round, also when each side runs on
    its own counts. (Gurobi, even at MIPGap 0, stops short of the optimum by a few 1e-6
    relative in some rounds.)"""
    exact = ref.load_authors(Path(reference().__file__).parents[1], ref.exact_solver())
    r = ref.compare(exact, "labels", n=20, k=4, alpha=0.1, seeds=30, rounds=5, spread=False)
    print(ref.report(r))
    assert r["h_rel"] <= 1e-9, r["h_rel"]
    assert r["equal_lockstep"] == r["rounds"], r["diffs"][:5]
    assert r["equal_free"] == r["rounds"]
    assert r["tv_fedsel"] == 0.0
