"""`framework run` and `framework config validate` check every key before any work, and
fail in one line: the values the run uses are the ones the check judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from framework.cli import main

pytestmark = pytest.mark.timeout(60)


def _config(tmp_path: Path, **changes: Any) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"x": i}) + "\n" for i in range(10)), encoding="utf-8")
    config = {
        "dataset_reader": {"type": "jsonl"},
        "data_path": str(data),
        "data_loader": {"batch_size": 4},
        **changes,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["run", "--no-progress", "--json", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_integral_float_epochs_runs_as_the_int_validate_accepted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # validate() and the schema take 2.0 as the integer 2 (as JSON does): the run must too
    code, out, err = _run(capsys, str(_config(tmp_path, epochs=2.0)))
    assert code == 0, err
    summary = json.loads(out)
    assert summary["epochs"] == 2 and isinstance(summary["epochs"], int)
    assert summary["instances"] == 20


def test_the_preflight_never_rejects_a_key_the_user_did_not_set(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # An eager config that validate() accepts; the preflight builds the loader lazy
    # (so it reads nothing) by setting max_instances_in_memory itself: that key must
    # never be what fails, whatever batch size the user chose.
    huge = 2**62 + 1
    config = _config(tmp_path, data_loader={"batch_size": huge})
    assert main(["config", "validate", str(config)]) == 0
    capsys.readouterr()
    code, out, err = _run(capsys, str(config))
    assert "max_instances_in_memory" not in err
    assert code == 0, err
    assert json.loads(out)["batches"] == 1
