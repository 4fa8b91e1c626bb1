#!/usr/bin/env bash
# Runs FedAvg on one FLGo task in FLGo itself and in fedsel (`dataset.kind = "flgo"`), three
# seeds each, and prints both side by side (docs/results.md, "fedsel beside FLGo").
#
#   scripts/compare-flgo.sh [ROUNDS]
#
# Makes a venv (VENV, default target/flgo-venv) with CPU torch and flgo 0.4.4 from PyPI on
# first use. Writes the task and every run under OUT (default runs/flgo-compare).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-target/flgo-venv}
out=${OUT:-runs/flgo-compare}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu \
    || "$venv/bin/pip" install -q torch
  "$venv/bin/pip" install -q flgo==0.4.4
fi
cargo build --release --quiet -p fedsel-cli --bin fedsel
"$venv/bin/python" scripts/compare_flgo.py \
  --fedsel "${CARGO_TARGET_DIR:-target}/release/fedsel" \
  --config configs/flgo/synthetic_fedavg.toml --rounds "${1:-200}" --out "$out"
