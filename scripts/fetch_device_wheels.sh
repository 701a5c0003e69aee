#!/usr/bin/env bash
# Download the Python wheels that the GPU machine (device tool: Python 3.12,
# no network) lacks, into <repo>/.whl, which git ignores through
# .git/info/exclude and which device runs carry (carry: [".whl"]).
# scripts/device_env.sh installs them there.
#
# Left out on purpose:
#   - safetensors, ml_dtypes, opencv (headless), matplotlib, pillow, pyyaml,
#     requests, psutil, nvidia-ml-py, transformers, torchvision: already there.
#   - polars (~40 MB) and ultralytics-platform: ultralytics imports them lazily
#     (results tables, training, platform API), not for import or DetectionModel.
#   - nvidia-cutlass-dsl and apache-tvm-ffi (~600 MB with theirs): the cuDNN
#     frontend imports them only for its CuTe-DSL kernels; `import cudnn` and the
#     graph API work without them. libcudnn comes from nvidia-cudnn-cu13 there.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude

wheels=(
    nvmath-python==1.0.0
    nvidia-cudnn-frontend==1.32.0
    ultralytics==8.4.190
    ultralytics-thop==2.2.3
    torchao==0.17.0
)

mkdir -p .whl
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 \
    -d .whl "${wheels[@]}" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }
echo "fetch_device_wheels: $(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl"
