"""`framework run` and `framework config validate` check every key before any work, and
fail in one line: the values the run uses are the ones the check judged."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from framework import DataLoader, DatasetReader
from framework.cli import main
from framework.testing import fresh_registry

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


class _CrashingRules(DatasetReader):
    """A reader whose declared rules crash: a plugin's bug, met while checking."""

    @staticmethod
    def config_checks(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
        raise RuntimeError("rules\nbroken")

    def _read(self, file_path: Any) -> Iterator[Any]:
        yield from ()


def _validate_cases(tmp_path: Path) -> dict[str, list[str]]:
    good = _config(tmp_path)
    (tmp_path / "folder.json").mkdir()
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"data_path": "caf\xe9"}')
    return {
        "a folder": [str(tmp_path / "folder.json")],
        "a missing file": [str(tmp_path / "missing.json")],
        "not UTF-8": [str(latin1)],
        "a NUL in the path": [str(tmp_path / "a\0b.json")],
        "bad JSON override": [str(good), "--override", "{bad"],
        "an override too big to merge": [str(good), "--override", "[" * 100_000],
        "an int no float holds": [str(good), "--override", '{"data_loader": {"timeout": 1%s}}' % ("0" * 400)],
        "rules that crash": [str(good), "--override", '{"dataset_reader": {"type": "crashing_rules"}}'],
    }


@pytest.mark.parametrize(
    "case",
    ["a folder", "a missing file", "not UTF-8", "a NUL in the path", "bad JSON override",
     "an override too big to merge", "an int no float holds", "rules that crash"],
)  # fmt: skip
def test_config_validate_fails_in_one_line_on_stdout_and_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    with fresh_registry():
        DatasetReader.register("crashing_rules")(_CrashingRules)
        code = main(["config", "validate", *_validate_cases(tmp_path)[case]])
    out, err = capsys.readouterr()
    assert (code, err) == (1, ""), (out, err)
    assert len(out.splitlines()) == 1, out
    assert "Traceback" not in out and "-v" not in out


def test_a_loader_forwarding_kwargs_is_preflighted_lazy_and_fetches_its_url(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    http_server: tuple[str, list[str]],
    isolated_cache: Path,
) -> None:
    # Its keys are its parent's (through **kwargs): the preflight must build it lazy, so it
    # reads nothing before the download (eager, it read the URL as a local path and failed).
    from framework.data import MultiProcessDataLoader

    class Forwarding(MultiProcessDataLoader):
        def __init__(self, label: str = "", **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.label = label

    url, gets = http_server
    (tmp_path / "www" / "data.jsonl").write_text(
        "".join(json.dumps({"x": i}) + "\n" for i in range(10)), encoding="utf-8"
    )
    config = _config(tmp_path, data_path=f"{url}/data.jsonl", data_loader={"type": "fwd", "batch_size": 4})
    with fresh_registry():
        DataLoader.register("fwd")(Forwarding)
        code, out, err = _run(capsys, str(config))
    assert code == 0, err
    assert json.loads(out)["instances"] == 10 and gets == ["/data.jsonl"]
