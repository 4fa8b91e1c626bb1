"""The `fedsel` console script is the Rust CLI: in process, and from a fresh venv's PATH."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fedsel
from fedsel import _fedsel

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_runs_in_process_and_returns_its_status(tmp_path, capfd):
    out = tmp_path / "r"
    assert _fedsel.cli(["fedsel", "run", "--set", "rounds=2", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
    assert "2 rounds" in capfd.readouterr().out
    # The same refusal as the binary's, with the CLI's flags in it, and no exit.
    assert _fedsel.cli(["fedsel", "run", "--set", "rounds=2", "--out", str(out)]) == 1
    assert "pass --overwrite" in capfd.readouterr().err
    # Bad arguments: clap's status 2, still without exiting Python.
    assert _fedsel.cli(["fedsel", "run", "--no-such-flag"]) == 2
    assert "--no-such-flag" in capfd.readouterr().err


def test_the_script_stops_a_run_on_sigterm_as_the_binary_does(tmp_path):
    # The script that installing the package (here `maturin develop`) put beside Python.
    script = Path(sys.executable).parent / "fedsel"
    assert script.is_file(), f"no fedsel script at {script}"
    out = tmp_path / "r"
    child = subprocess.Popen(
        [script, "run", "--set", "rounds=100000", "--set", "eval.every=1000", "--out", out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "metrics.csv").exists() or os.path.getsize(out / "metrics.csv") < 2000:
        assert time.monotonic() < deadline, "the run wrote no rounds"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143, err
    assert "SIGTERM: interrupted after round" in err and "Traceback" not in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "interrupted" in summary["error"], summary
    assert summary["rounds_completed"] == len(fedsel.read_metrics(out / "metrics.csv")["round"])


def test_pip_install_puts_fedsel_on_the_path(tmp_path):
    """The README's `pip install ./python`, in a fresh venv: its `fedsel` runs.

    The build backend (maturin) comes from PyPI as pip's build isolation would fetch it,
    but into the venv itself (--no-build-isolation), and CARGO_TARGET_DIR is the one the
    test suite's extension was built in, so the Rust build is reused.
    """
    venv = tmp_path / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    scripts = venv / "bin"
    pip = [scripts / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "maturin>=1.5,<2"], check=True)
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    # The venv's scripts first, as in an activated venv: the backend runs `maturin`.
    env = dict(os.environ, CARGO_TARGET_DIR=target, PATH=f"{scripts}:{os.environ['PATH']}")
    subprocess.run([*pip, "--no-build-isolation", ROOT / "python"], check=True, env=env)
    installed = time.monotonic() - started
    script = scripts / "fedsel"
    assert script.is_file(), "pip install put no fedsel script in the venv"
    out = tmp_path / "r"
    # The venv's PATH only, as a user who activated it has.
    p = subprocess.run(
        ["fedsel", "run", "--set", "rounds=2", "--out", out],
        env=dict(env, PATH=f"{scripts}:/usr/bin:/bin"),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["rounds"]) == ("finished", 2)
    assert f"fedsel {fedsel.__version__}" in p.stdout
    print(f"fresh venv with fedsel installed in {installed:.0f} s")


def test_the_modules_warnings_carry_no_colour_off_a_terminal(tmp_path):
    # A sweep cell logs its config's warnings through the core's log, to stderr: a pipe here.
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "t"\n[config]\nrounds = 1\nserver = { aggregation = "data_size" }\n[axes]\nseed = [1]\n'
    )
    code = f"import fedsel; fedsel.sweep({str(path)!r}, {str(tmp_path / 'out')!r}, jobs=1)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "overrides uniform's own rule" in p.stderr, p.stderr
    assert "\x1b" not in p.stderr, repr(p.stderr)
