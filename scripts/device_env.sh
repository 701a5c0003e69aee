# Source this at the start of every command sent to the GPU machine (device
# tool), with `.whl` in carry:
#
#   source scripts/device_env.sh || exit 1; python3 -m pytest -q tests ...
#
# It installs the carried wheels (.whl/*.whl, made here by
# scripts/fetch_device_wheels.sh) into /tmp/site once per machine, puts
# /tmp/site and the repo on PYTHONPATH, and sets the variables the tests and
# ultralytics need. It returns non-zero (never exits the caller's shell) when
# something is missing, so `|| exit 1` stops the command.

_aotrt_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1

if ! ls "$_aotrt_repo"/.whl/*.whl >/dev/null 2>&1; then
    echo "device_env: no wheels in $_aotrt_repo/.whl (run scripts/fetch_device_wheels.sh here and carry .whl)" >&2
    return 1
fi

# Reinstall only when the set of wheels changed (a warm machine keeps /tmp).
_aotrt_key="$(ls "$_aotrt_repo"/.whl/*.whl | xargs -n1 basename | sort | sha256sum | cut -c1-16)"
if [ "$(cat /tmp/site/.aotrt-wheels 2>/dev/null)" != "$_aotrt_key" ]; then
    rm -rf /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$_aotrt_repo"/.whl/*.whl || { echo "device_env: wheel install failed" >&2; return 1; }
    echo "$_aotrt_key" > /tmp/site/.aotrt-wheels
fi

case ":${PYTHONPATH:-}:" in
    *":/tmp/site:"*) ;;
    *) export PYTHONPATH="/tmp/site:$_aotrt_repo${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
export YOLO_OFFLINE=1
export YOLO_CONFIG_DIR=/tmp/yolo
export HF_HUB_OFFLINE=1
export PYTHONUNBUFFERED=1
mkdir -p "$YOLO_CONFIG_DIR"
unset _aotrt_repo _aotrt_key
