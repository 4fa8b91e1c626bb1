"""The one way the drivers fetch a reference from PyPI: a wheel downloaded at run time into a
temporary directory (its code is never part of this repository)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


class Unavailable(RuntimeError):
    """The reference could not be had (no network, no pip, no checkout)."""


def download_wheel(spec: str, into: Path, pattern: str, timeout: int = 120) -> Path:
    """`pip download --no-deps spec` into `into`; the wheel matching `pattern` there, or
    `Unavailable` saying what pip said."""
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(into), spec],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
    except (subprocess.SubprocessError, OSError) as e:
        detail = getattr(e, "stderr", b"") or b""
        raise Unavailable(f"pip download {spec} failed: {detail.decode(errors='replace')[-300:] or e}") from e
    wheel = next(into.glob(pattern), None)
    if wheel is None:
        raise Unavailable(f"pip download {spec} left no wheel in {into}")
    return wheel
