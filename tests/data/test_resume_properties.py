"""Property: resume is exactly once (issue 24).

Random readers (built-in seekable "text"/"jsonl"/"csv" over several files with CRLF or
lone-CR line ends, blank lines, byte-order marks, no final newline; custom readers that
are not seekable, one sharding its records itself and skipping some), samplers (basic
or bucket, with or without `sorting_keys`, shuffle, `drop_last`, `batches_per_epoch`),
lazy or eager, `num_workers` 0-3, states saved twice, random interruption points and
kinds, resumed twice with other `num_workers`: see `property_helpers` for one trial.

CI runs a small budget; the long profile (it prints the number of trials run):
``FRAMEWORK_PROPERTY_EXAMPLES=500 python -m pytest tests/data/test_resume_properties.py``
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, reject, settings
from property_helpers import Case, Unsuitable, property_examples, run_case
from resume_cases import cases

pytestmark = pytest.mark.timeout(600)

TRIALS = {"count": 0}


@pytest.fixture(scope="module", autouse=True)
def report_trials(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None and TRIALS["count"]:
        with capture.global_and_fixture_disabled():
            print(f"\nresume properties: {TRIALS['count']} trials run")


@settings(
    max_examples=property_examples(20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(case=cases())
def test_resume_is_exactly_once(case: Case) -> None:
    TRIALS["count"] += 1
    with tempfile.TemporaryDirectory() as folder:
        try:
            run_case(case, Path(folder))
        except Unsuitable:
            reject()
