"""Shared test fixtures: where the CLI binary and the datasets are."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `fedsel` binary built from this workspace (test.sh builds it first)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    path = Path(os.environ.get("FEDSEL_BIN", target / "release" / "fedsel"))
    assert path.is_file(), f"no CLI binary at {path}: build it with `cargo build --release` or set FEDSEL_BIN"
    return path


def data_dir() -> Path:
    """The shared dataset directory, as the Rust tests find it."""
    return Path(os.environ.get("FEDSEL_DATA", ROOT.parent / "shared" / "data"))
