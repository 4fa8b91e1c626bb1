"""FedScale's own device files, written by Python's pickle as FedScale's are, drive a run."""

import pickle

import pytest

import fedsel

CLIENTS = 30  # the default synthetic task's


def write(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)
    return str(path)


def files(tmp_path):
    """Identical devices; client k reads entry k + 1 (FedScale's mapping), so entry 1 (client 0)
    is online only around 5·10⁸ s, never within the run, and every other client from 10 s on."""
    devices = {i: {"computation": 1.0, "communication": 32.0} for i in range(CLIENTS)}
    trace = {
        i: {"active": [10], "inactive": [9e8], "finish_time": 1e9, "duration": 0, "model": "x"}
        for i in range(CLIENTS)
    }
    trace[1] = {"active": [5e8], "inactive": [5e8 + 1], "finish_time": 1e9}
    return write(tmp_path / "client_device_capacity", devices), trace


def config(devices, trace):
    return {
        "rounds": 3,
        "selection": {"clients_per_round": 10},
        "system": {"kind": "fedscale", "path": devices, "behave_trace": trace},
    }


def test_fedscale_pickles_drive_the_virtual_clock(tmp_path):
    devices, trace = files(tmp_path)
    res = fedsel.run(config(devices, write(tmp_path / "client_behave_trace", trace)), out=tmp_path / "r")
    assert res.summary["status"] == "finished"
    clock = res.metrics["clock_s"]
    # Nobody is online before 10 s, so the first round ends after it; the clock only advances.
    assert clock[0] > 10.0
    assert all(b > a for a, b in zip(clock, clock[1:]))
    assert res.summary["clock_s"] == pytest.approx(clock[-1])
    # Client 0 is offline throughout: 29 available each round.
    assert res.metrics["n_available"].tolist() == [CLIENTS - 1] * 3


def test_a_malformed_trace_names_the_file_and_the_client(tmp_path):
    devices, trace = files(tmp_path)
    del trace[4]["inactive"]
    bad = write(tmp_path / "broken_trace", trace)
    with pytest.raises(fedsel.FedselError) as caught:
        fedsel.run(config(devices, bad), out=tmp_path / "r")
    message = str(caught.value)
    assert "broken_trace" in message
    assert "client 3 (the file's client 4)" in message
    assert "`inactive` is missing" in message
