"""Shared pytest setup: make `multirank` importable (here and in spawned ranks), and tier tests
by the hardware they need: `gpu` / `multi_gpu` tests are skipped with a reason on machines
without enough CUDA devices."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _num_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def pytest_collection_modifyitems(config, items):
    gpus = _num_gpus()
    slow = os.environ.get("UCCL_EP_TEST_SLOW", "0") == "1"
    for item in items:
        if "multi_gpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs (found {gpus}); runs on the GPU machine"))
        elif "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; runs on the GPU machine"))
        if "slow" in item.keywords and not slow:
            item.add_marker(pytest.mark.skip(reason="slow stress test: set UCCL_EP_TEST_SLOW=1"))


@pytest.fixture(scope="session")
def world1():
    """A 1-rank gloo process group in the test process (for single-process API/validation tests)."""
    import datetime

    import torch.distributed as dist

    from multirank import free_port

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60))
    return dist.group.WORLD
