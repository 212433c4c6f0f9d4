import importlib.util
import os
import sys

import pytest

# Tests import the packages from this checkout even before `pip install -e .`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _cpu_unless_gpu_test(request, monkeypatch):
    """Tests not marked `gpu` run their engines on the CPU, also on a GPU host.

    Their tiny models have head size 16, which the CUDA kernels do not serve;
    "auto" devices follow PAGED_DEVICE (engine.models.loader.resolve_device),
    and CLI subprocesses inherit it.
    """
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("PAGED_DEVICE", "cpu")


@pytest.fixture(scope="module")
def bench(request):
    """The bench script a test module names in its BENCH, loaded as a module."""
    path = request.module.BENCH
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module      # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
