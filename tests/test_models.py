"""aotrt/models.py: the demo's models and the CLI's model lookup, with its refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aotrt.errors import AotrtError, InvalidArgument

torch = pytest.importorskip("torch")

from aotrt import models  # noqa: E402 - after the torch check


def small() -> Any:
    """A factory: a small module."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU()).train()


class SmallClass(torch.nn.Linear):
    """A module class with a no-argument constructor."""

    def __init__(self) -> None:
        super().__init__(3, 2)


def not_a_module() -> int:
    """A factory that returns something else."""
    return 3


def broken() -> Any:
    """A factory that fails."""
    raise RuntimeError("no weights here")


INSTANCE = torch.nn.Tanh()
NUMBER = 7


def test_tiny_yolo_runs_and_is_deterministic() -> None:
    a, b = models.tiny_yolo(64), models.tiny_yolo(64)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ya, yb = a(x), b(x)
    # 4 boxes + 8 classes per anchor; anchors at strides 4 and 8 of a 64-pixel input.
    assert ya.shape == (1, 12, 16 * 16 + 8 * 8)
    assert torch.equal(ya, yb) and torch.isfinite(ya).all()
    assert not a.training


def test_load_model_by_name_and_by_factory() -> None:
    name, m = models.load_model("tiny-yolo", 32)
    assert name == "TinyYolo" and isinstance(m, torch.nn.Module)
    name, m = models.load_model(f"{__name__}:small", 32)
    assert name == "small" and not m.training            # put in eval mode
    name, m = models.load_model(f"{__name__}:SmallClass", 32)
    assert isinstance(m, SmallClass)
    name, m = models.load_model(f"{__name__}:INSTANCE", 32)
    assert m is INSTANCE


@pytest.mark.parametrize("spec,error,match", [
    ("foo", InvalidArgument, "expected 'yolov8n'"),
    (":small", InvalidArgument, "expected 'yolov8n'"),
    ("tests.no_such_module:f", InvalidArgument, "no module named 'tests.no_such_module'"),
    (f"{__name__}:smal", InvalidArgument, "has no 'smal' \\(did you mean 'small'"),
    (f"{__name__}:zzzzzz", InvalidArgument, "has no 'zzzzzz'$"),
    (f"{__name__}:NUMBER", InvalidArgument, "is a int, not a torch.nn.Module"),
    (f"{__name__}:not_a_module", InvalidArgument, "returned a int"),
    (f"{__name__}:broken", AotrtError, "broken\\(\\) failed: RuntimeError: no weights"),
    ("missing.pt2", InvalidArgument, "no such file 'missing.pt2'"),
])
def test_load_model_refusals(spec: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        models.load_model(spec, 32)


def test_a_missing_dependency_stays_an_import_error(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that imports something absent is not a typo in the path."""
    (tmp_path / "needs_absent.py").write_text("import absent_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="absent_dependency_xyz"):
        models.load_model("needs_absent:f", 32)


def test_pt2_files(tmp_path: Path) -> None:
    ep = torch.export.export(small().eval(), (torch.randn(2, 6),))
    torch.export.save(ep, tmp_path / "s.pt2")
    name, loaded = models.load_model(str(tmp_path / "s.pt2"), 32)
    assert name == "s" and isinstance(loaded, torch.export.ExportedProgram)
    x = torch.randn(2, 6)
    assert torch.allclose(loaded.module()(x), ep.module()(x))
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(InvalidArgument, match="not a program saved by torch.export.save"):
        models.load_model(str(tmp_path / "junk.pt2"), 32)
    (tmp_path / "dir.pt2").mkdir()
    with pytest.raises(InvalidArgument, match="no such file"):
        models.load_model(str(tmp_path / "dir.pt2"), 32)


def test_demo_model_falls_back_to_the_built_in_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> Any:
        raise ImportError("no ultralytics")

    monkeypatch.setattr(models, "yolov8n", unavailable)
    name, m = models.demo_model("auto", 32)
    assert name.startswith("TinyYolo")
    with pytest.raises(AotrtError, match="ultralytics is not available"):
        models.demo_model("yolov8n", 32)
