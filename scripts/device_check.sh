#!/usr/bin/env bash
# On the GPU machine, after `source scripts/device_env.sh || exit 1`:
# report which of the packages aotrt relies on import and work there.
# Each check prints one line, "ok ..." or "FAIL ..."; the script goes on past failures
# and exits non-zero if any failed.
fails=0
check() {  # check NAME PYTHON-CODE
    local out
    if out="$(python3 -c "$2" 2>&1)"; then
        echo "ok   $1: $(echo "$out" | tail -n1)"
    else
        echo "FAIL $1: $(echo "$out" | tail -n3 | tr '\n' ' ')"
        fails=$((fails + 1))
    fi
}
check python 'import sys; print(sys.version.split()[0], sys.executable)'
check torch 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0))'
check cuda.core 'import cuda.core; print(cuda.core.__version__)'
check cuda.bindings 'import cuda.bindings; print(cuda.bindings.__version__)'
check cuda.pathfinder 'import cuda.pathfinder as p; print(p.__version__)'
check cupy 'import cupy; print(cupy.__version__)'
check safetensors 'import safetensors; print(safetensors.__version__)'
check ml_dtypes 'import ml_dtypes; print(ml_dtypes.__version__)'
check numpy 'import numpy; print(numpy.__version__)'
check nvmath 'import nvmath; print(nvmath.__version__, nvmath.__file__)'
check nvmath.matmul '
import cupy as cp, nvmath
a = cp.random.rand(64, 32, dtype=cp.float32); b = cp.random.rand(32, 16, dtype=cp.float32)
c = nvmath.linalg.advanced.matmul(a, b)
print("max err", float(cp.abs(c - a @ b).max()))'
check cudnn 'import cudnn; print("frontend", cudnn.__version__, "backend", cudnn.backend_version())'
check cudnn.handle 'import cudnn; h = cudnn.create_handle(); print("handle", bool(h)); cudnn.destroy_handle(h)'
check ultralytics '
import ultralytics
from ultralytics.nn.tasks import DetectionModel
m = DetectionModel("yolov8n.yaml", verbose=False)
print(ultralytics.__version__, "yolov8n params", sum(p.numel() for p in m.parameters()))'
check transformers 'import transformers; from transformers import GPT2Config, GPT2Model; GPT2Model(GPT2Config(n_layer=1, n_embd=64, n_head=4)); print(transformers.__version__)'
check torchvision 'import torch, torchvision; print(torchvision.__version__, torchvision.ops.nms(torch.rand(3,4), torch.rand(3), 0.5).shape)'
check aotrt 'import aotrt; print(aotrt.__file__)'
nvidia-smi || fails=$((fails + 1))
echo "device_check: $fails failed"
[ "$fails" -eq 0 ]
