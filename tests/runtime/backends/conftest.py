"""The op tests' fixtures (tests/runtime/ops/conftest.py), for the backends' op tests."""

from tests.runtime.ops.conftest import dnnl, kit  # noqa: F401 - fixtures, found by name
