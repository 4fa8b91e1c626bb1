"""The ``fedsel`` console script: the Rust command line itself, so that ``pip install``
puts on the PATH the same ``fedsel`` that ``cargo install --path crates/fedsel-cli`` does."""

from __future__ import annotations

import signal
import sys

from . import _fedsel


def main() -> None:
    """Runs ``fedsel`` on ``sys.argv`` and exits with its status."""
    # The CLI stops a run on SIGINT after its round, writes its summary and exits 130, as
    # the binary does; Python's own handler would add a KeyboardInterrupt once the CLI
    # returns. Outside a run, Ctrl-C kills the process, as it does the binary.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_fedsel.cli(["fedsel", *sys.argv[1:]]))
