#!/usr/bin/env bash
# Runs the prepared GPU check (./dev bench --gpu) on a GPU machine with Python 3.12 and PyTorch but
# no network, from what scripts/gpu-bundle.sh packed into .gpuhost/. Results go to $1 (default
# bench-out): gpu.md, gpu.json and the log. Extra arguments go to benchmark/run.py.
#   on this workplace's device machine: run(command="scripts/gpu-check.sh $OUT", carry=[".gpuhost"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out}
shift || true
mkdir -p "$out"
work=$(mktemp -d)
tar -C "$work" -xJf .gpuhost/site.tar.xz
tar -C "$work" -xJf .gpuhost/comfyui.tar.xz
export COMFYUI_DIR=$(echo "$work"/ComfyUI)
export PYTHONPATH="$work/site:$PWD/tests:$PWD/benchmark"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu-check.log"
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' | tee -a "$out/gpu-check.log"
python3 -P benchmark/run.py --gpu --threads "$(nproc)" --out "$out" "$@" 2>&1 | tee -a "$out/gpu-check.log"
