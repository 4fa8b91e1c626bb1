#!/usr/bin/env bash
# Builds the Python package into python/.venv and runs its pytest suite.
#
# The extension is built with the workspace's release profile into the same target
# directory as `cargo test --release` (CARGO_TARGET_DIR if set, else target/), so the
# burn stack the Rust tests compiled is reused, not rebuilt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet "maturin>=1.5,<2" pytest hypothesis numpy "flwr[simulation]>=1.20"
# The trackers' tests read event files back with TensorBoard's own reader and run the W&B and
# MLflow callbacks offline; without these packages they are skipped, saying why.
"$venv/bin/pip" install --quiet tensorboard tbparse wandb mlflow-skinny \
    || echo "test.sh: tensorboard, tbparse, wandb or mlflow-skinny not installed; their tests are skipped" >&2
# `maturin develop --release` builds the abi3 wheel's extension in place of a wheel
# round trip; `pip install ./python` (the README's command) builds the same crate.
# The tests compare against the CLI built from this workspace.
(cd "$root" && cargo build --release --quiet -p fedsel-cli --bin fedsel)
(cd "$here" && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" maturin develop --release --quiet)
cd "$here"
"$venv/bin/python" -m pytest -q tests "$@"
