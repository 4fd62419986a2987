"""Property: resume is exactly once under torch.distributed (gloo, 1-3 ranks), the world
size and num_workers changed on resume (issue 24). One trial: see
`property_helpers.run_distributed_case`. The rank processes are started once and serve
every trial (a process group per phase). CI runs a small budget; the long profile:
``FRAMEWORK_PROPERTY_EXAMPLES=100 python -m pytest tests/data/test_resume_properties_distributed.py``
(the budget here is a fifth of that number)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, reject, settings
from property_helpers import Case, Ranks, Unsuitable, property_examples, run_distributed_case
from resume_cases import cases

pytestmark = pytest.mark.timeout(900)

TRIALS = {"count": 0}


@pytest.fixture(scope="module")
def ranks(request: pytest.FixtureRequest) -> Iterator[Ranks]:
    processes = Ranks(3)
    yield processes
    processes.close()
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None and TRIALS["count"]:
        with capture.global_and_fixture_disabled():
            print(f"\nresume properties, distributed: {TRIALS['count']} trials run")


@settings(
    max_examples=max(1, property_examples(20) // 5),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(case=cases(world=True))
def test_resume_is_exactly_once_across_world_sizes(ranks: Ranks, case: Case) -> None:
    TRIALS["count"] += 1
    with tempfile.TemporaryDirectory() as folder:
        try:
            run_distributed_case(ranks, case, Path(folder))
        except Unsuitable:
            reject()
