#!/usr/bin/env bash
# Run the test suite on this machine: bash scripts/test.sh [--all] [pytest args...]
# Sets up .venv first (a no-op when it is current). By default it runs the CI slice, the cases
# not marked `slow` (-m "not slow"), so that .ci/run stays under about 15 minutes on 2 cores;
# --all as the first argument, or AOTRT_TEST_ALL=1, runs every case. A -m of your own wins.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

select=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
    shift
    select=()
fi
if [ "${AOTRT_TEST_ALL:-0}" = "1" ]; then
    select=()
fi

bash scripts/setup_env.sh

export AOTRT_CHECK_HAZARDS=1
export YOLO_OFFLINE=1          # no DNS look-ups when ultralytics is imported
export HF_HUB_OFFLINE=1        # models are built from configs; nothing is downloaded
yolo_dir="$(mktemp -d)"
trap 'rm -rf "$yolo_dir"' EXIT
export YOLO_CONFIG_DIR="$yolo_dir"

rc=0
# pytest keeps the last -m it is given: the caller's, after ours.
.venv/bin/python -m pytest -q tests ${select[@]+"${select[@]}"} "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    # pytest's "no tests collected"
    echo "test.sh: no tests were collected" >&2
    exit 0
fi
exit "$rc"
