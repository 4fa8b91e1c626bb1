"""The ``fedsel`` console script: the Rust command line itself, so that ``pip install``
puts on the PATH the same ``fedsel`` that ``cargo install --path crates/fedsel-cli`` does."""

from __future__ import annotations

import os
import signal
import sys

from . import _fedsel


def main() -> None:
    """Runs ``fedsel`` on ``sys.argv`` and exits with its status."""
    # The CLI stops a run on SIGINT after its round, writes its summary and exits 130, as
    # the binary does; Python's own handler would add a KeyboardInterrupt once the CLI
    # returns. Outside a run, Ctrl-C kills the process, as it does the binary.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # A selector named `py:module:Class` is imported from the working directory too, as
    # `python -m` would: a console script's path starts at its own directory instead.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    sys.exit(_fedsel.cli(["fedsel", *sys.argv[1:]]))
