"""cuda_device and pin_memory on a real GPU (skipped cleanly without CUDA)."""

from __future__ import annotations

import pytest
import torch

from framework.data.multiprocess import MultiProcessDataLoader
from tests.support.loader import CountingReader

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("lazy", [None, 8])
def test_batches_arrive_on_the_device(method: str, lazy: object) -> None:
    data = MultiProcessDataLoader(
        CountingReader(20), "x", batch_size=4, num_workers=2, start_method=method,
        max_instances_in_memory=lazy, cuda_device=0, quiet=True,
    )
    batches = list(data)
    assert all(b["tokens"].device.type == "cuda" for b in batches)
    ids = sorted(i for b in batches for i in b["id"].cpu().tolist())
    assert ids == list(range(20))


def test_pin_memory_pins_cpu_batches() -> None:
    data = MultiProcessDataLoader(CountingReader(8), "x", batch_size=4, num_workers=2,
                                  max_instances_in_memory=4, pin_memory=True, quiet=True)
    assert all(b["tokens"].is_pinned() for b in data)
