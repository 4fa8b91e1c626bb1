"""Writes FedScale device and behave pickles holding NumPy scalars and arrays, as Python
scripts that build these files with NumPy leave them, for the tests of fedsel's reader
(`crates/fedsel/tests/fedscale_numpy.rs`).

Run it with numpy 1.x and with numpy 2.x (their scalars pickle under
`numpy.core.multiarray` and `numpy._core.multiarray`):

    python3 -m venv /tmp/np1 && /tmp/np1/bin/pip install 'numpy<2'
    python3 -m venv /tmp/np2 && /tmp/np2/bin/pip install 'numpy>=2'
    /tmp/np1/bin/python make_numpy_pickles.py && /tmp/np2/bin/python make_numpy_pickles.py

Each writes, next to this script, for pickle protocols 0, 2, 4 and 5:
`np<major>-p<protocol>-device.pkl`, `np<major>-p<protocol>-behave.pkl`, and one file of
a NumPy type fedsel refuses (`np<major>-p<protocol>-float16.pkl`); and, at protocol 4,
a behave file with big-endian arrays (`np<major>-bigendian.pkl`, read) and one with a 2-D
array (`np<major>-2d.pkl`, refused). The values are the ones
`expected()` gives, which the Rust test repeats.
"""

import pickle
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def device() -> dict:
    """Four devices keyed by numpy.int64, Python int and numpy.int32; computation as
    numpy.float64, float32 and a Python float; communication as numpy.int64 and
    numpy.float64."""
    return {
        np.int64(0): {"computation": np.float64(10.5), "communication": np.int64(800)},
        1: {"computation": np.float32(20.25), "communication": np.float64(1500.5)},
        np.int32(2): {"computation": 30.0, "communication": np.int64(2500)},
        np.int64(3): {"computation": np.float64(40.125), "communication": np.uint16(3200)},
    }


def behave() -> dict:
    """Three traces, in this order: active/inactive as numpy arrays of float64 and int64,
    a list of numpy scalars, a plain list; finish_time as numpy.float64, numpy.int64 and
    numpy.int32; and a numpy.bool_ flag that fedsel ignores."""
    return {
        np.int64(10): {
            "active": np.array([0.0, 100.0, 250.5]),
            "inactive": np.array([50, 200, 300], dtype=np.int64),
            "finish_time": np.float64(1000.0),
            "model_sync": np.bool_(True),
        },
        np.int64(11): {
            "active": [np.float64(5.0), np.float64(60.0)],
            "inactive": [np.int64(30), np.int64(90)],
            "finish_time": np.int64(500),
            "model_sync": np.bool_(False),
        },
        12: {
            "active": [0.0],
            "inactive": np.array([40.0], dtype=np.float32),
            "finish_time": np.int32(400),
            "model_sync": True,
        },
    }


def main() -> None:
    major = np.__version__.split(".")[0]
    for protocol in (0, 2, 4, 5):
        stem = HERE / f"np{major}-p{protocol}"
        for name, value in (("device", device()), ("behave", behave())):
            Path(f"{stem}-{name}.pkl").write_bytes(pickle.dumps(value, protocol=protocol))
        half = {1: {"computation": np.float16(1.5), "communication": 100.0}}
        Path(f"{stem}-float16.pkl").write_bytes(pickle.dumps(half, protocol=protocol))
        print(f"wrote {stem}-*.pkl with numpy {np.__version__}")
    # NumPy scalars are always in native order; arrays keep theirs.
    big = {0: {"active": np.array([0.0, 100.5], dtype=">f8"), "inactive": np.array([50, 200], dtype=">i4"), "finish_time": 1000.0}}
    (HERE / f"np{major}-bigendian.pkl").write_bytes(pickle.dumps(big, protocol=4))
    flat = {0: {"computation": 1.0, "communication": 2.0, "history": np.zeros((2, 2))}}
    (HERE / f"np{major}-2d.pkl").write_bytes(pickle.dumps(flat, protocol=4))


if __name__ == "__main__":
    main()
