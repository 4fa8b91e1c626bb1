"""The one distance every driver compares selection frequencies by."""

from __future__ import annotations

import numpy as np


def tv(a: np.ndarray, b: np.ndarray) -> float:
    """Total-variation distance between two selection-count vectors, each normalised to a
    distribution first (so counts over different numbers of runs compare)."""
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())
