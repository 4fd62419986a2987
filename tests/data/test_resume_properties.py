"""Property: resume is exactly once (issue 24).

Random readers (built-in seekable "text"/"jsonl"/"csv" over several files, plain, `.gz`
or `.zst`, with CRLF or lone-CR line ends, blank lines, byte-order marks, no final
newline; custom readers that are not seekable, one sharding its records itself and
skipping some), samplers (basic or bucket, with or without `sorting_keys`, shuffle,
`drop_last`, `batches_per_epoch`), lazy or eager, `num_workers` 0-3, states saved twice,
random interruption points and kinds, resumed twice with other `num_workers`; the
file readers' files also streamed over HTTP (URLs or a brace range, `cache_limit`,
`prefetch`): see `tests.support.resume_properties` for one trial.

CI runs a small budget; the long profile (it prints the number of trials run):
``FRAMEWORK_PROPERTY_EXAMPLES=500 python -m pytest tests/data/test_resume_properties.py``
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, reject

from tests.support.download import FaultServer
from tests.support.resume_cases import KNOWN_DEFECTS, cases
from tests.support.resume_properties import (
    Case,
    FileSpec,
    Unsuitable,
    print_trials,
    property_examples,
    property_settings,
    run_case,
    shard_server,
)

EXAMPLES = property_examples(35)
pytestmark = pytest.mark.timeout(120 + 3 * EXAMPLES)  # a long profile gets time to match

TRIALS = {"count": 0, "streamed": 0}


@pytest.fixture(scope="module", autouse=True)
def report_trials(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_trials(request, "resume properties", TRIALS["count"], TRIALS["streamed"])


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    """Serves the streamed cases' files: one for every trial."""
    with shard_server() as running:
        yield running


@property_settings(EXAMPLES)
@given(case=cases())
def test_resume_is_exactly_once(server: FaultServer, case: Case) -> None:
    TRIALS["count"] += 1
    TRIALS["streamed"] += case.streamed
    with tempfile.TemporaryDirectory() as folder:
        try:
            run_case(case, Path(folder), server)
        except Unsuitable:
            reject()


# Streamed: three .gz files over HTTP as a brace range (one empty), the shards' order
# shuffled per epoch, each process holding one shard fetched ahead within the least
# cache_limit (shards evicted and fetched again); resumed mid-chunk with 2 workers, then
# with none.
STREAMED = Case(
    source="jsonl",
    files=(FileSpec(records=5), FileSpec(records=0), FileSpec(records=6, blank=(2,))),
    compression=".gz",
    streamed=True,
    brace=True,
    cache_limit=0,
    prefetch=1,
    lazy=3,
    batch_size=2,
    workers=(1, 2, 0),
    saves=(1, 2),
    take=2,
    next_epoch=True,
)


def test_a_streamed_case_resumes_exactly_once(server: FaultServer, tmp_path: Path) -> None:
    run_case(STREAMED, tmp_path, server)


# The smallest failing cases hypothesis found for the known defects (issue 24), one per
# flag: expected to fail while the flag is in KNOWN_DEFECTS, and to pass once it is not.
KNOWN_DEFECT_CASES = {
    # the cache order with 2 workers is 1, 2 against 2, 1 with none: C resumes the
    # exact position in another order
    "eager_fewer_instances_other_workers": Case(
        source="sharded", n=3, skip=(0,), batch_size=1, shuffle=False, workers=(0, 0, 2), saves=(0, 0), take=0
    ),
    # chunk 0 (record 0: "tags" is longest) sets the keys of the uninterrupted run; B resumes in
    # chunk 1 (records 100, 101: "tokens") and guesses again. With workers=(2, 0, 0) and take=7
    # (files of 6, 3 with line 0 blank, 0 records) instance 102 even comes twice.
    "lazy_bucket_guessed_keys": Case(
        source="jsonl",
        files=(FileSpec(records=1), FileSpec(records=3), FileSpec(records=0)),
        lazy=2,
        bucket=True,
        sorting_keys=False,
        batch_size=1,
        shuffle=False,
        saves=(0, 0),
        take=3,
    ),
    # a KeyboardInterrupt in the collator on B's first batch: B's state is the next epoch
    "exception_in_next": Case(source="plain", n=2, batch_size=1, saves=(0, 0), take=0, interrupt="in_next"),
    # B saves after `break`: the state is the next epoch's, batch 1 comes again
    "state_after_exit": Case(
        source="plain", n=2, batch_size=1, shuffle=False, saves=(0, 0), take=1, save_after_exit=True
    ),
    # data0.csv is a header without a newline: "the resume offset 7 is not the start of a line"
    "no_final_newline_several_files": Case(
        source="csv",
        files=(FileSpec(records=0, final_newline=False), FileSpec(records=4)),
        batch_size=1,
        shuffle=False,
        saves=(0, 0),
        take=0,
    ),
    # jsonl: "not valid JSON (Unexpected UTF-8 BOM ...)" on a fresh pass
    "bom": Case(source="jsonl", files=(FileSpec(records=2, bom=True),), batch_size=1, saves=(0, 0), take=0),
    # found by the long profile after the fixes: with batches_per_epoch, an exception in the
    # resumed pass's first next() reset the epoch's count, and C went on into the next pass
    "batches_per_epoch_cut_before_a_batch": Case(
        source="plain",
        n=2,
        batch_size=1,
        shuffle=False,
        batches_per_epoch=2,
        saves=(1, 1),
        take=0,
        interrupt="in_next",
    ),
    "batches_per_epoch_cut_before_a_batch_lazy": Case(
        source="plain",
        n=2,
        lazy=1,
        batch_size=1,
        shuffle=False,
        batches_per_epoch=2,
        workers=(0, 0, 2),
        saves=(1, 1),
        take=0,
        interrupt="in_next",
    ),
}


@pytest.mark.parametrize(
    "flag",
    [
        pytest.param(flag, marks=pytest.mark.xfail(flag in KNOWN_DEFECTS, reason="known defect", strict=True))
        for flag in KNOWN_DEFECT_CASES
    ],
)
def test_known_defect_cases(flag: str, tmp_path: Path) -> None:
    run_case(KNOWN_DEFECT_CASES[flag], tmp_path)
