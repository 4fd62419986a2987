"""How many parts a request asks for (`Runs.share`): its bounds over any input."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from framework.download.parallel._runs import Runs

MiB = 1 << 20

_inputs = st.fixed_dictionaries(
    {
        "run_parts": st.integers(1, 64),
        "part": st.sampled_from([64 * 1024, MiB, 8 * MiB]),
        "wait": st.one_of(st.none(), st.floats(0, 5)),
        "rate": st.one_of(st.none(), st.floats(1e3, 1e10)),
        "pace": st.one_of(st.none(), st.floats(1, 1e10)),
        "connections": st.integers(1, 64),
        "todo": st.integers(0, 5000),
        "claimed": st.integers(0, 5000),
        "held": st.integers(1, 80),
    }
)


@settings(max_examples=300, deadline=None)
@given(_inputs)
def test_a_share_is_at_least_its_floor_and_never_over_a_run(given_: dict[str, Any]) -> None:
    """Any waits, rates, counts: 1 <= share <= run_parts; at least the paying run or an
    even share of the unwritten parts (rounded up), whichever is less, unless the
    server's answers outlast a whole run (then a whole run); more than that only to
    take a remainder no larger than a wait's parts, which the run can hold."""
    runs = Runs(given_["run_parts"], given_["part"], given_["wait"])
    if given_["rate"]:
        runs.flowed(given_["part"], given_["part"] / given_["rate"])
    todo, held, pace = given_["todo"], given_["held"], given_["pace"]
    unwritten = todo + given_["claimed"]
    share = runs.share(given_["connections"], todo, unwritten, pace, held)
    assert 1 <= share <= runs.run_parts
    if runs.waits_outlast_runs():
        assert share == runs.run_parts
        return
    floor = min(runs.paying_run(pace), max(1, -(-unwritten // given_["connections"])))
    assert share >= min(runs.run_parts, floor)
    usual = min(runs.run_parts, max(floor, todo // given_["connections"]))
    if share != usual:  # the remainder was taken: all of it, within a run
        left = todo - max(0, usual - held)
        assert 0 < left <= runs.wait_parts(pace) and share == held + todo <= runs.run_parts


def test_a_run_never_takes_a_remainder_longer_than_a_wait() -> None:
    """Answers wait 0.2 s at 8 MiB/s (a paying run of 13 parts, 1 whole part per wait),
    4 connections, 27 parts unwritten: a claim with 12 left after its part takes an
    even share (7); taking the 13 would end it long after the other connections."""
    runs = Runs(16, MiB, 0.2)
    runs.flowed(MiB, 1 / 8)
    pace = 8 * MiB
    assert (runs.paying_run(pace), runs.wait_parts(pace)) == (13, 1)
    assert runs.share(4, todo=12, unwritten=27, pace=pace) == math.ceil(27 / 4)
    assert runs.share(4, todo=7, unwritten=27, pace=pace) == 8  # takes the 1 part left: a wait's
    assert runs.share(4, todo=7, unwritten=20, pace=pace) == 5  # leaves 3: not taken
