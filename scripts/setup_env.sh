#!/usr/bin/env bash
# Create or refresh the project's virtual environment in <repo>/.venv.
#
# Idempotent: a stamp file records a hash of pyproject.toml, this script and
# whether aotrt/__init__.py exists; when it matches, the script returns at once
# and prints nothing. Otherwise it (re)installs, checks the imports, and prints
# one line.
#
#   bash scripts/setup_env.sh          # install if needed
#   AOTRT_SETUP_FORCE=1 bash scripts/setup_env.sh   # reinstall regardless of the stamp
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
py="$venv/bin/python"
stamp="$venv/.aotrt-setup-stamp"
python_bin="${AOTRT_PYTHON:-python3.11}"

# torch/torchvision pins: the combination under which torch, torchvision,
# ultralytics and transformers all import together (see export-notes.md).
# pip takes both from the local mirror on this machine (a CUDA build that also
# runs on the CPU).
torch_pins=(torch==2.14.1 torchvision==0.29.1)

key() {
    {
        cat "$repo/pyproject.toml" "$repo/scripts/setup_env.sh"
        [ -f "$repo/aotrt/__init__.py" ] && echo "has-init" || echo "no-init"
        echo "$python_bin"
    } | sha256sum | cut -d' ' -f1
}

want="$(key)"
if [ -z "${AOTRT_SETUP_FORCE:-}" ] && [ -x "$py" ] && [ -f "$stamp" ] \
        && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

# One setup at a time per checkout (tests may be started side by side).
lock="${TMPDIR:-/tmp}/aotrt-setup-$(printf '%s' "$repo" | sha256sum | cut -c1-16).lock"
exec 9>"$lock"
flock 9
# Someone else may have finished the job while we waited.
if [ -z "${AOTRT_SETUP_FORCE:-}" ] && [ -x "$py" ] && [ -f "$stamp" ] \
        && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
rm -f "$stamp"

# A venv made by another Python (or a broken one) is rebuilt.
if [ -e "$venv" ] && ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    rm -rf "$venv"
fi
if [ ! -x "$py" ]; then
    "$python_bin" -m venv "$venv"
fi

# pip -q still warns about each missing local index folder named in this
# machine's pip config; drop those lines, keep everything else.
pipq() {
    "$py" -m pip -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "^WARNING: Location 'file://.*' is ignored" || true; }
}
start=$SECONDS
pipq install "${torch_pins[@]}"
# The pins are repeated so that no extra can move torch off them.
pipq install -e "$repo[export,dev,models,cuda]" "${torch_pins[@]}"

# Check that the stack imports together: ultralytics needs torchvision's
# metadata, transformers needs a torchvision whose ops load (nms).
# YOLO_OFFLINE=1 stops ultralytics' DNS look-ups at import.
check_dir="$(mktemp -d)"
trap 'rm -rf "$check_dir"' EXIT
if ! YOLO_OFFLINE=1 YOLO_CONFIG_DIR="$check_dir" HF_HUB_OFFLINE=1 \
        "$py" - >"$check_dir/log" 2>&1 <<'PY'
import warnings
warnings.simplefilter("ignore")
import numpy, safetensors, ml_dtypes, torch, torchvision
import torchvision.ops  # registers torchvision::nms; fails on a mismatched torchvision
import ultralytics, transformers
from ultralytics.nn.tasks import DetectionModel
from transformers import GPT2Model  # pulls torchvision in beside pillow
import cuda.core, cuda.bindings, nvmath
import pytest, hypothesis
from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl  # the cpu device's convolutions (onednn-cpu-gomp)
if cpu_dnnl.library() is None:
    raise SystemExit("onednn-cpu-gomp: libdnnl.so.3 is not installed or does not load")
PY
then
    cat "$check_dir/log" >&2
    echo "setup_env: the import check failed; .venv left without a stamp" >&2
    exit 1
fi

echo "$want" > "$stamp"
echo "setup_env: .venv ready in $((SECONDS - start)) s ($("$py" -c 'import torch, sys; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")'))"
