#!/usr/bin/env bash
# Run the demo: bash scripts/demo.sh [args for `aotrt demo`...]
# Uses the default device (cuda if present, else cpu). Sets up .venv first.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

bash scripts/setup_env.sh

export YOLO_OFFLINE=1
export HF_HUB_OFFLINE=1
export YOLO_CONFIG_DIR="${YOLO_CONFIG_DIR:-$repo/.aotrt-cache/yolo}"
mkdir -p "$YOLO_CONFIG_DIR"

exec .venv/bin/python -m aotrt demo "$@"
