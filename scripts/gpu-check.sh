#!/usr/bin/env bash
# Measures fedsel's CUDA path on a machine that has one (issue 12). This development VM
# has no GPU, so the figures come from wherever this script is run; it writes them under
# OUT (default gpu-check/) with the machine's description, for docs/results.md.
#
#   scripts/gpu-check.sh [DATA_DIR] [ROUNDS]
#
# DATA_DIR holds fashion-mnist/ (default ../shared/data); ROUNDS is the length of the
# HiCS-FL FMNIST CNN run (default 200, the paper's). Needs a CUDA toolkit for the build.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-../shared/data}
rounds=${2:-200}
out=${OUT:-gpu-check}
mkdir -p "$out"

cargo build --release -p fedsel-cli --features cuda
bin=${CARGO_TARGET_DIR:-target}/release/fedsel

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    lscpu | grep -m1 'Model name' || true
    git rev-parse HEAD
} > "$out/machine.txt"

# `fedsel bench` times the CPU paths (flex), the reference for the GPU run below.
"$bin" bench --data-dir "$data" | tee "$out/bench-cpu.txt"

# One HiCS-FL FMNIST run with the paper's CNN, on the GPU and then on the CPU, timed by
# the shell so that data loading and evaluation count too.
for device in cuda flex; do
    start=$(date +%s.%N)
    "$bin" run configs/hics/fmnist_s1_hics.toml --data-dir "$data" --seed 1 \
        --set rounds="$rounds" --set device="\"$device\"" \
        --out "$out/hics-$device" --overwrite | tee "$out/hics-$device.log"
    end=$(date +%s.%N)
    awk -v d="$device" -v s="$start" -v e="$end" -v r="$rounds" \
        'BEGIN { printf "%s: %.1f s for %d rounds\n", d, e - s, r }' | tee -a "$out/times.txt"
done
