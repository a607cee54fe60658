#!/usr/bin/env bash
# Packs what the prepared GPU check (./dev bench --gpu) needs on a GPU machine that has Python 3.12
# and PyTorch but no network and no ComfyUI (this workplace's device machines): the ComfyUI 0.30.0
# tree of the local host, and the host's packages such an image lacks, as cp312 wheels installed
# into one folder. Both go to .gpuhost/ (git-ignored) as xz tarballs, under the device's 64 MiB;
# scripts/gpu-check.sh unpacks them there and runs the check.
#
# PyAV (a 36 MB wheel of FFmpeg libraries) does not fit beside comfy-kitchen (ComfyUI 0.30.0's
# kernels, FLUX's rope among them: it must be the real one). ComfyUI imports av only to read and
# write video files, which the check never does, so scripts/gpu_bundle/av_standin.py stands in for
# it (every name a placeholder that raises when used).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/host.sh
ensure_host 0.30.0
out=.gpuhost
lock=scripts/host-lock-0.30.0.txt
# The host's packages that the check imports (a trace of `./dev bench --gpu --gpu-geometry tiny`)
# and the device image does not hold (/work/.library/device/KINDS.md lists what it holds).
missing=(alembic annotated-types blake3 comfy-aimdo comfy-kitchen greenlet kornia kornia_rs Mako pydantic pydantic_core
         pydantic-settings python-dotenv simpleeval spandrel SQLAlchemy torchsde trampoline truststore
         typing-inspection)
requirements=()
for name in "${missing[@]}"; do
  requirements+=("$(grep -i "^$name==" "$lock")")
done
rm -rf "$out" && mkdir -p "$out/site/av"
python3 -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --no-compile --target "$out/site" "${requirements[@]}"
cp scripts/gpu_bundle/av_standin.py "$out/site/av/__init__.py"
tar -C "$out" -cf - site | xz -6 -T0 > "$out/site.tar.xz"
# The tree without the tokenizers' vocabularies (no text encoder is loaded).
tar -C "$(dirname "$COMFYUI_DIR")" --exclude='*/tests' --exclude='*/tests-unit' --exclude='*tokenizer/*.json' --exclude='*tokenizer/*.txt' --exclude='*tokenizer/*.model' \
  --exclude='__pycache__' -cf - "$(basename "$COMFYUI_DIR")" | xz -6 -T0 > "$out/comfyui.tar.xz"
rm -rf "$out/site"
du -ch "$out"/*.tar.xz
