"""The model zoo (issue #10): third-party architectures, built from their constructors and
configs with seeded random weights (nothing downloaded), exported by aotrt and compared with
torch eager.

    .venv/bin/python bench/zoo.py [--families torchvision,timm,hf,ultralytics]
        [--device cpu] [--dtypes float32[,float16]] [--only NAME,...] [--limit N]
        [--timeout 600] [--workers 1] [--threads 0] [--time] [--fp32-math ieee|eager]
        [--out bench/results/zoo/zoo-cpu.json]

Each model runs in a subprocess of its own (a crash or a hang in one cannot stop the run),
with a progress line as it ends. Per model and dtype it records one status:
- `ok`: aotrt's output matches the reference as well as eager's own does in that dtype;
- `mismatch`: it runs, but its error is worse than that bound;
- `eager_unstable`: eager's own error in the dtype is 0.5 or more (or not finite): the
  model overflows in that dtype with random weights, and no verdict is possible;
- `torch_export`: torch.export itself cannot capture the model (torch's own error);
- `aotrt_export`, `aotrt_run`: aotrt refused or failed (its error);
- `build`, `timeout`, `crash`: the zoo could not build the model, or the subprocess
  ran out of time or died.
Random weights let the signal of many deep networks fade (torchvision's MobileNet-v2 gives
outputs of norm 1e-8, which fp16 flushes to zero) or grow, so the zoo first recalibrates
every BatchNorm's running statistics on two random batches (`_calibrate`): activations are
then of order one, as in a trained model, and an fp16 comparison means something.
The reference is the model in float64 eager on the same inputs (float32 where float64 does
not run); the bound is max(floor, 2 x eager's own error in the dtype), floors fp32 1e-4,
fp16/bf16 2e-2. Outputs are every floating tensor the model returns, compared one by one.
A table by family and status is printed at the end, and the JSON has every row.

`--workers N` runs N models at once (each still in its own process); `--threads N` caps
the threads of a cpu delegate (aotrt.load(threads=N)), so that workers do not oversubscribe
the cores. `--time` (cuda) also times each model that matched, in its own process: torch
eager against aotrt's default runner (a CUDA graph replay), median of 20 runs after 5,
CUDA events on each runner's stream. Only one process times at a time (a file lock), so
the GPU is not shared while it is timed; the other workers go on exporting meanwhile.
`--fp32-math eager` (cuda, float32) loads each delegate with the aotrt.Fp32Math of torch's
own flags, so both run the same math: eager's convolutions run TF32 by default
(`torch.backends.cudnn.allow_tf32`), aotrt's only when asked. The default, `ieee`, keeps
aotrt in float32 while eager runs its default.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
FLOOR = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
#: eager's own error from which a model cannot be judged in a dtype (random weights at
#: fp16 overflow some deep networks: eager's error is then inf, nan or about 1)
UNSTABLE = 0.5

# ------------------------------------------------------------------------------------------
# the models


@dataclass(frozen=True)
class Case:
    """One zoo model: its family, name and a builder returning (module, example inputs)."""

    family: str
    name: str
    build: Callable[[], tuple[Any, tuple]]
    note: str = ""


def _img(size: int = 64, batch: int = 1) -> tuple:
    import torch

    return (torch.randn(batch, 3, size, size),)


def _torchvision() -> list[Case]:
    import torchvision

    cases = []
    skip = {"vit_h_14", "regnet_y_128gf"}       # hundreds of millions of weights
    for name in torchvision.models.list_models(module=torchvision.models):
        if name in skip:
            continue
        size = 224 if name.startswith(("vit", "swin", "maxvit")) else 64
        if name.startswith("inception") or name == "googlenet":
            size = 96

        def build(name: str = name, size: int = size) -> tuple[Any, tuple]:
            kw = {"aux_logits": False, "init_weights": False} if name in (
                "inception_v3", "googlenet") else {}
            return torchvision.models.get_model(name, weights=None, **kw), _img(size)
        cases.append(Case("torchvision", name, build))
    for name in torchvision.models.list_models(module=torchvision.models.segmentation):
        def build(name: str = name) -> tuple[Any, tuple]:
            m = torchvision.models.get_model(name, weights=None, weights_backbone=None)
            return _flat(m), _img(96)
        cases.append(Case("torchvision-seg", name, build))
    for name in torchvision.models.list_models(module=torchvision.models.video):
        if name.startswith(("mvit", "swin3d", "s3d")):
            size, frames = 64, 16
        else:
            size, frames = 32, 4

        def build(name: str = name, size: int = size, frames: int = frames) -> tuple:
            import torch
            m = torchvision.models.get_model(name, weights=None)
            return m, (torch.randn(1, 3, frames, size, size),)
        cases.append(Case("torchvision-video", name, build))
    return cases


TIMM = ["resnet18d", "resnet26t", "resnest14d", "nf_resnet26", "nfnet_f0", "regnetx_002",
        "regnety_002", "efficientnet_b0", "efficientnet_lite0", "tf_efficientnetv2_b0",
        "mobilenetv3_small_100", "mobilenetv2_050", "convnext_atto", "convnextv2_atto",
        "vit_tiny_patch16_224", "deit_tiny_patch16_224", "deit_tiny_distilled_patch16_224",
        "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "maxvit_nano_rw_256",
        "coatnet_nano_rw_224", "volo_d1_224", "tresnet_m", "mobilevit_xxs", "mobilevitv2_050",
        "edgenext_xx_small", "levit_128s", "efficientformer_l1", "efficientformerv2_s0",
        "poolformer_s12", "poolformerv2_s12", "convmixer_768_32", "mixer_b16_224",
        "resmlp_12_224", "gmlp_ti16_224", "cait_xxs24_224", "xcit_nano_12_p16_224",
        "pit_ti_224", "tnt_s_patch16_224", "twins_svt_small", "pvt_v2_b0", "crossvit_tiny_240",
        "coat_lite_tiny", "beit_base_patch16_224", "eva02_tiny_patch14_224", "dla34",
        "dpn48b", "hrnet_w18_small", "inception_v4", "inception_resnet_v2", "xception41",
        "cspresnet50", "cspdarknet53", "darknet53", "ghostnet_100", "ghostnetv2_100",
        "hardcorenas_a", "lcnet_050", "mnasnet_small", "rexnet_100", "repvgg_a0",
        "res2net50_14w_8s",
        "sebotnet33ts_256", "halonet26t", "lambda_resnet26t", "selecsls42b", "skresnet18",
        "tinynet_a", "vovnet39a", "ese_vovnet19b_dw", "fastvit_t8", "repghostnet_050",
        "efficientvit_b0", "hgnet_tiny", "hgnetv2_b0", "inception_next_tiny", "rdnet_tiny",
        "mambaout_femto", "starnet_s1", "nextvit_small"]


def _timm() -> list[Case]:
    import timm

    known = set(timm.list_models())
    cases = []
    for name in TIMM:
        if name not in known:
            continue

        def build(name: str = name) -> tuple[Any, tuple]:
            import torch
            m = timm.create_model(name, pretrained=False)
            cfg = m.pretrained_cfg or {}
            size = (cfg.get("input_size") or (3, 224, 224))[-1]
            return m, (torch.randn(1, 3, size, size),)
        cases.append(Case("timm", name, build))
    return cases


# (model_type, input kind) for transformers' AutoModel; small configs are made by shrinking
# the usual size fields of the default config.
HF = [("bert", "text"), ("roberta", "text"), ("distilbert", "text"), ("albert", "text"),
      ("electra", "text"), ("deberta", "text"), ("deberta-v2", "text"), ("xlm-roberta", "text"),
      ("camembert", "text"), ("mpnet", "text"), ("funnel", "text"), ("convbert", "text"),
      ("squeezebert", "text"), ("mobilebert", "text"), ("layoutlm", "text"), ("ernie", "text"),
      ("roformer", "text"), ("nezha", "text"), ("canine", "text"), ("fnet", "text"),
      ("longformer", "text"), ("big_bird", "text"), ("megatron-bert", "text"),
      ("xlnet", "text"), ("ibert", "text"), ("nystromformer", "text"), ("yoso", "text"),
      ("gpt2", "text"), ("gpt_neo", "text"), ("gptj", "text"), ("gpt_neox", "text"),
      ("opt", "text"), ("bloom", "text"), ("llama", "text"), ("mistral", "text"),
      ("mixtral", "text"), ("qwen2", "text"), ("qwen2_moe", "text"), ("qwen3", "text"),
      ("phi", "text"), ("phi3", "text"), ("gemma", "text"), ("gemma2", "text"),
      ("falcon", "text"), ("stablelm", "text"), ("starcoder2", "text"), ("olmo", "text"),
      ("codegen", "text"), ("ctrl", "text"), ("biogpt", "text"), ("xglm", "text"),
      ("t5", "seq2seq"), ("bart", "seq2seq"), ("mbart", "seq2seq"), ("pegasus", "seq2seq"),
      ("marian", "seq2seq"), ("blenderbot", "seq2seq"), ("m2m_100", "seq2seq"),
      ("led", "seq2seq"), ("prophetnet", "seq2seq"),
      ("vit", "image"), ("deit", "image"), ("beit", "image"), ("swin", "image"),
      ("convnext", "image"), ("convnextv2", "image"), ("resnet", "image"), ("regnet", "image"),
      ("mobilenet_v2", "image"), ("mobilevit", "image"), ("efficientnet", "image"),
      ("levit", "image"), ("poolformer", "image"), ("segformer", "image"),
      ("dinov2", "image"), ("yolos", "image"), ("vit_mae", "image"), ("data2vec-vision",
                                                                      "image"),
      ("whisper", "whisper"), ("wav2vec2", "audio"), ("hubert", "audio"),
      ("data2vec-audio", "audio"), ("wavlm", "audio"), ("unispeech", "audio"),
      ("sew", "audio"), ("speech_to_text", "speech2text"), ("clap", "skip"),
      ("clip", "clip")]

_SHRINK = {"hidden_size": 64, "d_model": 64, "n_embd": 64, "dim": 64, "embed_dim": 64,
           "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2,
           "encoder_layers": 2, "decoder_layers": 2, "num_attention_heads": 4, "n_head": 4,
           "n_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "encoder_ffn_dim": 128,
           "decoder_ffn_dim": 128, "n_inner": 128, "ffn_dim": 128, "hidden_dim": 128,
           "vocab_size": 512, "max_position_embeddings": 128, "num_local_experts": 4,
           "num_experts": 4, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
           "head_dim": 16, "embedding_size": 64, "d_kv": 16, "d_ff": 128}


def _hf_config(model_type: str) -> Any:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    # Special token ids must stay inside a shrunk vocabulary (Whisper's pad id is 50256).
    ids = [getattr(cfg, k, None) for k in ("pad_token_id", "bos_token_id", "eos_token_id",
                                             "decoder_start_token_id", "sep_token_id")]
    top = max([i for i in ids if isinstance(i, int)], default=0)
    for k, v in _SHRINK.items():
        if k == "vocab_size" and top >= v:
            v = top + 1
        if hasattr(cfg, k) and isinstance(getattr(cfg, k), int) and not isinstance(
                getattr(cfg, k), bool):
            try:
                setattr(cfg, k, v)
            except NotImplementedError:     # e.g. Funnel: its depth is block_sizes
                pass
    try:
        cfg._attn_implementation = "eager"      # plain attention: what torch.export sees
    except Exception:  # noqa: BLE001 - read-only on some configs
        pass
    if hasattr(cfg, "_experts_implementation"):
        # MoE experts as batched matmuls over every expert: static shapes, which torch.export
        # needs ("eager" loops over the experts hit, a data-dependent guard; the default
        # "grouped_mm" is a custom op with data-dependent offsets).
        cfg._experts_implementation = "batched_mm"
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    return cfg


def _flat(inner: Any, kwargs_names: tuple[str, ...] = ()) -> Any:
    """`inner` wrapped so that it returns a flat tuple of its tensor outputs (positional
    arguments passed by these keyword names when given)."""
    import torch
    import torch.utils._pytree as pytree

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> tuple:
            out = self.inner(**dict(zip(kwargs_names, args))) if kwargs_names else \
                self.inner(*args)
            if hasattr(out, "to_tuple"):
                out = out.to_tuple()
            return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
    return Flat().eval()


def _hf() -> list[Case]:
    cases = []
    for model_type, kind in HF:
        if kind == "skip":
            continue

        def build(model_type: str = model_type, kind: str = kind) -> tuple[Any, tuple]:
            import torch
            from transformers import AutoModel

            cfg = _hf_config(model_type)
            g = torch.Generator().manual_seed(0)
            if kind == "clip":
                cfg.text_config.hidden_size = cfg.vision_config.hidden_size = 64
                for sub in (cfg.text_config, cfg.vision_config):
                    sub.num_hidden_layers, sub.num_attention_heads = 2, 4
                    sub.intermediate_size = 128
                cfg.text_config.vocab_size = 512
            try:
                m = AutoModel.from_config(cfg).eval()
            except TypeError:
                # Funnel maps to two classes (full and base), which AutoModel trips on.
                from transformers.models.auto.modeling_auto import MODEL_MAPPING
                cls = MODEL_MAPPING[type(cfg)]
                m = (cls[0] if isinstance(cls, tuple) else cls)(cfg).eval()
            ids = torch.randint(0, 500, (1, 16), generator=g)
            if kind == "text":
                return _flat(m, ("input_ids",)), (ids,)
            if kind == "seq2seq":
                return _flat(m, ("input_ids", "decoder_input_ids")), (ids, ids[:, :8])
            if kind == "image":
                size = getattr(cfg, "image_size", 64)
                size = size if isinstance(size, int) else size[0]
                ch = getattr(cfg, "num_channels", 3)
                return _flat(m, ("pixel_values",)), (torch.randn(1, ch, size, size),)
            if kind == "audio":
                return _flat(m, ("input_values",)), (torch.randn(1, 16000),)
            if kind == "whisper":
                n = cfg.num_mel_bins
                return _flat(m, ("input_features", "decoder_input_ids")), (
                    torch.randn(1, n, 2 * cfg.max_source_positions), ids[:, :4])
            if kind == "speech2text":
                return _flat(m, ("input_features", "decoder_input_ids")), (
                    torch.randn(1, 64, cfg.input_feat_per_channel), ids[:, :4])
            if kind == "clip":
                return _flat(m, ("input_ids", "pixel_values")), (
                    ids, torch.randn(1, 3, cfg.vision_config.image_size,
                                     cfg.vision_config.image_size))
            raise ValueError(kind)
        cases.append(Case("hf", model_type, build))
    return cases


YOLO = ["yolov3u", "yolov5nu", "yolov6n", "yolov8n", "yolov8n-seg", "yolov8n-pose",
        "yolov8n-obb", "yolov8n-cls", "yolov9t", "yolov10n", "yolo11n", "yolo11n-seg",
        "yolo11n-pose", "yolo11n-obb", "rtdetr-l"]


def _ultralytics() -> list[Case]:
    cases = []
    for name in YOLO:
        def build(name: str = name) -> tuple[Any, tuple]:
            import torch
            os.environ.setdefault("YOLO_OFFLINE", "1")
            from ultralytics.nn import tasks

            yaml = f"{name}.yaml"
            if name.startswith("rtdetr"):
                m = tasks.RTDETRDetectionModel(yaml, verbose=False)
            elif name.endswith("-seg"):
                m = tasks.SegmentationModel(yaml, verbose=False)
            elif name.endswith("-pose"):
                m = tasks.PoseModel(yaml, verbose=False)
            elif name.endswith("-obb"):
                m = tasks.OBBModel(yaml, verbose=False)
            elif name.endswith("-cls"):
                m = tasks.ClassificationModel(yaml, verbose=False)
            else:
                m = tasks.DetectionModel(yaml, verbose=False)
            m = m.eval()
            x = torch.randn(1, 3, 160, 160)
            with torch.no_grad():
                m(x)            # heads cache anchors and strides on the first call
            return _flat(m), (x,)
        note = ("ill-conditioned: its decoder queries are a top-k selection over encoder "
                "scores, so eager fp32 itself is far from fp64 and a near-tie picks other "
                "queries; a mismatch here needs a look, not a verdict" if
                name.startswith("rtdetr") else "")
        cases.append(Case("ultralytics", name, build, note))
    return cases


FAMILIES: dict[str, Callable[[], list[Case]]] = {
    "torchvision": _torchvision, "timm": _timm, "hf": _hf, "ultralytics": _ultralytics}


def cases(families: list[str]) -> list[Case]:
    """Every case of the named families whose library imports here."""
    out = []
    for fam in families:
        try:
            out.extend(FAMILIES[fam]())
        except ImportError as e:
            print(f"zoo: family {fam} skipped: {e}", file=sys.stderr)
    return out


# ------------------------------------------------------------------------------------------
# one model


def rel_err(got: Any, ref: Any) -> float:
    """Norm-wise relative error of a torch tensor against a reference (inf if not finite)."""
    g, r = got.double(), ref.double()
    if not bool(g.isfinite().all()):
        return float("inf")
    return float((g - r).norm() / r.norm().clamp_min(1e-30))


def tensors(out: Any) -> list:
    """Every tensor in a model's output, nested tuples, lists and dicts walked in order."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in tensors(o)]
    return []


def _floats(out: Any) -> list:
    import torch

    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in outs if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _time_model(m_dt: Any, fresh: list, d: Any) -> dict:
    """Median ms of eager and of the aotrt delegate, one runner after the other, under the
    zoo's timing lock (one process times the GPU at a time)."""
    import fcntl
    import statistics

    import torch

    def median(fn: Callable[[], Any], start: Callable[[], Any], stop: Callable[[], float]
               ) -> float:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        d.stream.commit_and_wait()
        times = []
        for _ in range(20):
            h = start()
            fn()
            times.append(stop(h))
        return statistics.median(times)

    def t_start() -> Any:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        return a, b

    def t_stop(h: Any) -> float:
        a, b = h
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    def a_start() -> Any:
        return d.stream.timing_event()

    def a_stop(e0: Any) -> float:
        e1 = d.stream.timing_event()
        e1.sync()
        return e1 - e0

    m_gpu = m_dt.to("cuda")
    x_gpu = [x.to("cuda") for x in fresh]
    lock = Path(os.environ.get("AOTRT_ZOO_LOCK", "/tmp/aotrt-zoo-time.lock"))
    with open(lock, "w") as f, torch.no_grad():
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            eager = median(lambda: m_gpu(*x_gpu), t_start, t_stop)
            aot = median(lambda: d.run(*x_gpu), a_start, a_stop)
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return {"eager_ms": round(eager, 4), "aotrt_ms": round(aot, 4),
            "graph": bool(getattr(d, "uses_graph", False))}


def _calibrate(m: Any, inputs: tuple, seed: int) -> None:
    """Set each BatchNorm's running mean and variance to the statistics of random inputs."""
    import torch

    bns = [b for b in m.modules() if isinstance(b, torch.nn.modules.batchnorm._BatchNorm)
           and b.track_running_stats]
    if not bns:
        return
    g = torch.Generator().manual_seed(seed + 7)
    saved = [(b.momentum, b.running_mean.clone(), b.running_var.clone()) for b in bns]
    try:
        for b in bns:
            b.reset_running_stats()
            b.momentum = None  # a cumulative average over the calibration batches
            b.train()
        with torch.no_grad():
            for _ in range(2):
                m(*[torch.randn(x.shape, generator=g).to(x.dtype) if x.is_floating_point()
                    else x for x in inputs])
    except Exception:  # noqa: BLE001 - a model that cannot calibrate keeps its statistics
        for b, (_, mean, var) in zip(bns, saved):
            b.running_mean.copy_(mean)
            b.running_var.copy_(var)
            b.num_batches_tracked.zero_()
    finally:
        for b, (mom, _, _) in zip(bns, saved):
            b.momentum = mom
        # The whole model back to eval, not only the BatchNorms: modules that cache in eval
        # mode drop what the calibration passes filled (timm's LeViT and EfficientFormer
        # cache attention biases in float32; a timm whose .to() keeps that cache gave fp16
        # programs float32 biases on the H200's torch 2.11).
        m.eval()


def _informative(m: Any, seed: int) -> int:
    """Give every all-zero weight of a linear, convolution or norm layer random values;
    returns how many. Zero-initialised heads (torchvision's ViTs, timm's MLP-Mixer, ResMLP,
    gMLP) made the output all zeros, so aotrt's and eager's errors were both 0 and the
    check could not fail; zero last-BatchNorm gammas (timm's ResNets) silenced whole
    residual branches the same way."""
    import torch

    g = torch.Generator().manual_seed(seed + 11)
    layers = (torch.nn.Linear, torch.nn.modules.conv._ConvNd,
              torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)
    n = 0
    with torch.no_grad():
        for mod in m.modules():
            w = getattr(mod, "weight", None)
            if not isinstance(mod, layers) or not isinstance(w, torch.nn.Parameter) \
                    or not w.is_floating_point() or w.numel() == 0 or bool(w.any()):
                continue
            if w.dim() >= 2:
                fan_in = w[0].numel()
                w.copy_(torch.randn(w.shape, generator=g) / fan_in ** 0.5)
            else:
                w.copy_(torch.rand(w.shape, generator=g) + 0.5)
            n += 1
    return n


def built(case: Case, seed: int = 0) -> tuple[Any, tuple]:
    """The case's model, seeded, in eval with recalibrated BatchNorms and no all-zero
    weights (`_informative`), and its inputs."""
    import torch

    torch.manual_seed(seed)
    m, inputs = case.build()
    m = m.eval()
    _informative(m, seed)
    _calibrate(m, inputs, seed)
    return m, inputs


def build(name: str, seed: int = 0) -> tuple[Any, tuple]:
    """`built` for the zoo model called `name` (any family)."""
    return built(next(c for c in cases(list(FAMILIES)) if c.name == name), seed)


def run_case(case: Case, device: str, dtype_name: str, seed: int = 0, threads: int = 0,
             timed: bool = False, fp32_math: str = "ieee") -> dict:
    """Build, export, run and judge one model in one dtype; a row of the zoo table.

    `fp32_math` "eager": a cuda float32 delegate may use TF32 where torch's flags let eager
    use it (`_eager_fp32_math`); "ieee": aotrt's default, float32 everywhere."""
    import copy

    import numpy as np
    import torch

    import aotrt
    from aotrt.errors import AotrtError

    row: dict[str, Any] = {"family": case.family, "model": case.name, "dtype": dtype_name,
                           "device": device}
    dt = getattr(torch, dtype_name)
    t0 = time.perf_counter()
    try:
        m, inputs = built(case, seed)
    except Exception as e:  # noqa: BLE001 - the zoo's own failure, recorded
        row.update(status="build", error=f"{type(e).__name__}: {e}"[:400])
        return row
    cast = [x.to(dt) if x.is_floating_point() else x for x in inputs]
    m_dt = copy.deepcopy(m).to(dt)
    try:
        with torch.no_grad():
            prog = aotrt.export(m_dt, tuple(cast))
    except AotrtError as e:
        torch_side = "torch.export could not capture" in str(e)
        row.update(status="torch_export" if torch_side else "aotrt_export",
                   error=str(e)[:400])
        return row
    except Exception as e:  # noqa: BLE001 - an unforeseen exporter failure is aotrt's
        row.update(status="aotrt_export", error=f"{type(e).__name__}: {e}"[:400])
        return row
    row["export_s"] = round(time.perf_counter() - t0, 2)
    g = torch.Generator().manual_seed(seed + 1)
    fresh = [torch.randn(x.shape, generator=g).to(x.dtype) if x.is_floating_point() else x
             for x in cast]
    try:
        load_kw: dict[str, Any] = {"threads": threads} if threads and device == "cpu" else {}
        if fp32_math == "eager" and device == "cuda" and dtype_name == "float32":
            load_kw["fp32_math"] = _eager_fp32_math()
            row["fp32_math"] = repr(load_kw["fp32_math"])
        d = aotrt.load(prog, device=device, **load_kw)
        inputs_np = [x.numpy() if x.dtype != torch.bfloat16 else x for x in fresh]
        outs = d.run(*inputs_np)
        got_f = [torch.from_numpy(np.asarray(o).astype(np.float64)) for o in outs
                 if o.dtype.name in FLOOR]
    except Exception as e:  # noqa: BLE001 - recorded
        row.update(status="aotrt_run", error=f"{type(e).__name__}: {e}"[:400])
        return row
    try:
        return _judge(row, m, m_dt, fresh, got_f, dtype_name, t0, d,
                      timed and device == "cuda")
    finally:
        d.close()


def _eager_fp32_math() -> Any:
    """The aotrt.Fp32Math of torch's own flags (cudnn.allow_tf32 is True by default)."""
    import torch

    import aotrt

    return aotrt.Fp32Math(conv_tf32=bool(torch.backends.cudnn.allow_tf32),
                          matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32))


def _judge(row: dict, m: Any, m_dt: Any, fresh: list, got_f: list, dtype_name: str,
           t0: float, d: Any, timed: bool) -> dict:
    """Compare with eager and the float64 reference; time the model if asked and it matched."""
    import copy

    import torch

    with torch.no_grad():
        if d.device.name == "cuda":
            # eager's own error is judged on the device, in the dtype: torch's cpu half
            # kernels (depthwise convolutions among them) are not what a cuda user runs
            eager = [t.cpu() for t in _floats(copy.deepcopy(m_dt).to("cuda")(
                *[x.to("cuda") for x in fresh]))]
        else:
            eager = _floats(m_dt(*fresh))
        try:
            ref = _floats(copy.deepcopy(m).double()(*[
                x.double() if x.is_floating_point() else x for x in fresh]))
            row["reference"] = "float64"
        except Exception:  # noqa: BLE001 - some models do not run in float64
            ref = _floats(copy.deepcopy(m).float()(*[
                x.float() if x.is_floating_point() else x for x in fresh]))
            row["reference"] = "float32"
    if len(got_f) != len(ref):
        row.update(status="mismatch", error=f"{len(got_f)} float outputs, eager has {len(ref)}")
        return row
    errs = [rel_err(a, r) for a, r in zip(got_f, ref)]
    eerrs = [rel_err(e, r) for e, r in zip(eager, ref)]
    bound = [max(FLOOR[dtype_name], 2 * ee) for ee in eerrs]
    row["err"] = max(errs) if errs else 0.0
    row["eager_err"] = max(eerrs) if eerrs else 0.0
    row["status"] = "ok" if all(e <= b for e, b in zip(errs, bound)) else "mismatch"
    if not all(ee < UNSTABLE for ee in eerrs):
        # eager itself is lost in this dtype (overflow, or an error near 100%): no verdict
        row["status"] = "eager_unstable"
    if timed and row["status"] == "ok":
        try:
            row.update(_time_model(m_dt, fresh, d))
        except Exception as e:  # noqa: BLE001 - a timing failure is noted, not a verdict
            row["time_error"] = f"{type(e).__name__}: {e}"[:200]
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


# ------------------------------------------------------------------------------------------
# driver


def _child(name: str, family: str, device: str, dtype: str, threads: int, timed: bool,
           fp32_math: str) -> None:
    # "torchvision-seg" and "torchvision-video" come from the torchvision family's list
    case = next(c for c in FAMILIES[family.split("-")[0]]() if c.name == name
                and c.family == family)
    try:
        row = run_case(case, device, dtype, threads=threads, timed=timed, fp32_math=fp32_math)
    except BaseException as e:  # noqa: BLE001 - reported as a row
        row = {"family": family, "model": name, "dtype": dtype, "device": device,
               "status": "crash", "error": traceback.format_exc()[-600:] or repr(e)}
    print("ROW " + json.dumps(row), flush=True)


def main() -> int:
    """Run the zoo and print the table; exit 0 (failures are rows, not errors)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--limit", type=int, default=0, help="at most N models per family")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per model")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "zoo" / "zoo-latest.json"))
    ap.add_argument("--workers", type=int, default=1, help="models run at once")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of each cpu delegate (0: the runtime's default)")
    ap.add_argument("--fp32-math", choices=("ieee", "eager"), default="ieee",
                    help="cuda float32: 'eager' lets aotrt use TF32 where torch's flags let "
                    "eager (convolutions, by torch's default); 'ieee' keeps float32")
    ap.add_argument("--time", action="store_true",
                    help="cuda: time eager and aotrt for each model that matched")
    ap.add_argument("--report", metavar="JSON",
                    help="print the markdown tables of a saved run and exit")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.report:
        print(report(json.loads(Path(a.report).read_text())))
        return 0
    if a.child:
        _child(*a.child, a.threads, a.time, a.fp32_math)
        return 0
    chosen = cases(a.families.split(","))
    if a.only:
        names = set(a.only.split(","))
        chosen = [c for c in chosen if c.name in names]
    if a.limit:
        per: collections.Counter = collections.Counter()
        chosen = [c for c in chosen if per.update([c.family]) or per[c.family] <= a.limit]
    rows: list[dict] = []
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               YOLO_OFFLINE="1", HF_HUB_OFFLINE="1")
    # families taken in turn, so that a run cut short still covers each of them
    by_family: dict[str, list[Case]] = collections.defaultdict(list)
    for c in chosen:
        by_family[c.family].append(c)
    turns = [c for group in itertools.zip_longest(*by_family.values()) for c in group if c]
    jobs = [(dtype, c) for dtype in a.dtypes.split(",") for c in turns]
    total = len(jobs)
    t_start = time.perf_counter()
    lock = threading.Lock()

    def one(job: tuple[str, Case]) -> None:
        dtype, c = job
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--child", c.name, c.family, a.device, dtype,
               "--threads", str(a.threads), "--fp32-math", a.fp32_math] + (
                   ["--time"] if a.time else [])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                               env=env, cwd=ROOT)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
            row = json.loads(lines[-1][4:]) if lines else {
                "family": c.family, "model": c.name, "dtype": dtype, "device": a.device,
                "status": "crash", "error": f"exit {p.returncode}: {p.stderr[-400:]}"}
        except subprocess.TimeoutExpired:
            row = {"family": c.family, "model": c.name, "dtype": dtype,
                   "device": a.device, "status": "timeout",
                   "error": f"over {a.timeout:.0f} s"}
        if c.note:
            row["note"] = c.note
        with lock:
            rows.append(row)
            err = (f" err {row['err']:.1e} (eager {row['eager_err']:.1e})" if "err" in row
                   else "")
            ms = (f" {row['aotrt_ms']:.3f} ms vs eager {row['eager_ms']:.3f}"
                  if "aotrt_ms" in row else "")
            print(f"[{len(rows)}/{total}] {c.family:18s} {c.name:34s} {dtype:8s} "
                  f"{row['status']:12s}{err}{ms} {time.perf_counter() - t:.0f}s "
                  f"{row.get('error', '')[:120]}", flush=True)
            _save(a.out, a, rows, time.perf_counter() - t_start)

    with concurrent.futures.ThreadPoolExecutor(max(1, a.workers)) as pool:
        list(pool.map(one, jobs))
    print(table(rows))
    timed = [r for r in rows if "aotrt_ms" in r]
    if timed:
        slow = sorted((r for r in timed if r["aotrt_ms"] > r["eager_ms"]),
                      key=lambda r: r["eager_ms"] / r["aotrt_ms"])
        print(f"\ntimed {len(timed)}; aotrt slower than eager on {len(slow)}:")
        for r in slow:
            print(f"  {r['model']} {r['dtype']}: {r['aotrt_ms']:.3f} ms vs eager "
                  f"{r['eager_ms']:.3f}")
    return 0


def _save(path: str, a: argparse.Namespace, rows: list[dict], seconds: float) -> None:
    doc = {"device": a.device, "dtypes": a.dtypes, "families": a.families,
           "seconds": round(seconds, 1), "load_avg": os.getloadavg()[0], "rows": rows}
    Path(path).write_text(json.dumps(doc, indent=1))


def report(doc: dict) -> str:
    """Markdown of a saved run: counts by family and status, the rows that are not ok,
    and the timed models (eager vs aotrt). Rows saved before the `eager_unstable` status
    existed are judged again by it from their recorded errors."""
    rows = doc["rows"]
    for r in rows:
        ee = r.get("eager_err")
        if r.get("status") in ("ok", "mismatch") and ee is not None and not ee < UNSTABLE:
            r["status"] = "eager_unstable"
    out = [f"device {doc['device']}, dtypes {doc['dtypes']}, {len(rows)} rows, "
           f"{doc['seconds']:.0f} s", "", table(rows), "", "| family | model | dtype | status "
           "| aotrt err | eager err | error |", "|---|---|---|---|--:|--:|---|"]
    for r in sorted(rows, key=lambda r: (r["status"], r["family"], r["model"])):
        if r["status"] == "ok":
            continue
        err = f"{r['err']:.1e}" if "err" in r else ""
        eerr = f"{r['eager_err']:.1e}" if "eager_err" in r else ""
        msg = (r.get("error") or "").replace("|", "/").replace("\n", " ")[:160]
        out.append(f"| {r['family']} | {r['model']} | {r['dtype']} | {r['status']} | {err} "
                   f"| {eerr} | {msg} |")
    timed = sorted((r for r in rows if "aotrt_ms" in r), key=lambda r: r["model"])
    if timed:
        faster = sum(r["aotrt_ms"] <= r["eager_ms"] for r in timed)
        out += ["", f"timed {len(timed)}: aotrt at or below eager on {faster}", "",
                "| model | dtype | eager ms | aotrt ms | graph |", "|---|---|--:|--:|---|"]
        out += [f"| {r['model']} | {r['dtype']} | {r['eager_ms']:.3f} | {r['aotrt_ms']:.3f} "
                f"| {r.get('graph')} |" for r in timed]
    return "\n".join(out)


def table(rows: list[dict]) -> str:
    """Counts by family and status, as a markdown table."""
    statuses = ["ok", "mismatch", "eager_unstable", "torch_export", "aotrt_export", "aotrt_run",
                "build", "timeout", "crash"]
    by: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        by[(r["family"], r["dtype"])][r["status"]] += 1
    lines = ["| family | dtype | " + " | ".join(statuses) + " |",
             "|---|---|" + "--:|" * len(statuses)]
    for (fam, dt), cnt in sorted(by.items()):
        lines.append(f"| {fam} | {dt} | " + " | ".join(str(cnt[s]) for s in statuses) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
