"""`framework run` and `framework config validate` check every key before any work, and
fail in one line: the values the run uses are the ones the check judged."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from framework import DataLoader, DatasetReader
from framework.cli import main
from framework.config import json_schema, validate
from framework.testing import fresh_registry

pytestmark = pytest.mark.timeout(60)
REPO_ROOT = Path(__file__).resolve().parents[2]


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


LOADER = {"dataset_reader": "text", "data_path": "x", "data_loader": {"batch_size": 1}}  # a valid config


def make_plugin(site: Path, dist: str, modules: dict[str, str], hook_body: str) -> None:
    """An installed distribution (a dist-info on `site`) whose hook runs `hook_body`."""
    site.mkdir(exist_ok=True)
    for name, text in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(text))
    hooks = (
        "from framework import hookimpl\n\n@hookimpl\n"
        "def framework_register_components(registrar):\n"
        "    from framework.data import DatasetReader\n"
        f"    {hook_body}\n"
    )
    (site / f"{dist}_hooks.py").write_text(hooks)
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[framework.plugins]\n{dist} = {dist}_hooks\n")


def run_cli(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO_ROOT)])
    return subprocess.run(
        [sys.executable, "-m", "framework", *argv],
        capture_output=True, text=True, env=environ, timeout=120, cwd=site,
    )  # fmt: skip


def write_json(path: Path, config: Any) -> str:
    path.write_text(json.dumps(config))
    return str(path)


# -- SystemExit from someone else's code is a failure, never a silent success ------------


@pytest.mark.timeout(120)
def test_a_component_module_calling_sys_exit_fails_validate_schema_and_run(tmp_path: Path) -> None:
    make_plugin(
        tmp_path, "exitplug", {"exitplug_comp": "import sys\nsys.exit(0)\n"},
        "registrar.add(DatasetReader, 'boom', 'exitplug_comp:Boom')",
    )  # fmt: skip
    config = write_json(tmp_path / "cfg.json", {"dataset_reader": "boom", "data_path": "x", "bogus": 1})
    checked = run_cli(tmp_path, "config", "validate", config)
    assert checked.returncode == 1, checked
    assert "dataset_reader.type" in checked.stdout and "SystemExit" in checked.stdout
    assert "bogus" in checked.stdout  # the other errors are still listed
    schema = run_cli(tmp_path, "config", "schema")
    assert schema.returncode == 0, schema
    undescribed = json.loads(schema.stdout)["x-framework-undescribed"]
    assert any("boom" in item["component"] and "SystemExit" in item["reason"] for item in undescribed)
    ran = run_cli(tmp_path, "run", config)
    assert ran.returncode != 0 and "SystemExit" in ran.stderr, ran


@pytest.mark.timeout(120)
def test_sys_exit_inside_a_constructor_fails_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    @DatasetReader.register("quitter")
    class Quitter(DatasetReader):
        def __init__(self) -> None:
            sys.exit(0)

    (tmp_path / "data.txt").write_text("a b\n")
    config = write_json(
        tmp_path / "cfg.json",
        {"dataset_reader": "quitter", "data_path": "data.txt", "data_loader": {"batch_size": 1}},
    )
    assert main(["run", config]) == 1
    assert "SystemExit(0)" in capsys.readouterr().err


def schema_errors(config: Any, base: Any = None, given: tuple[str, ...] | list[str] = ()) -> list[str]:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]


    schema = json_schema(base, given=given)
    return [error.message for error in Draft202012Validator(schema).iter_errors(config)]


# -- keys that `framework run` passes the loader itself ----------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", ["data_path", "reader"])
def test_a_loader_key_that_run_supplies_is_rejected_by_validate_schema_and_run(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    (tmp_path / "corpus.txt").write_text("one\ntwo\n")
    (tmp_path / "other.txt").write_text("".join(f"line {i}\n" for i in range(7)))
    value = str(tmp_path / "other.txt") if key == "data_path" else "text"
    config = {
        "dataset_reader": "text",
        "data_path": "corpus.txt",
        "data_loader": {"batch_size": 1, key: value},
    }
    errors = validate(config)
    assert [e.path for e in errors] == [f"data_loader.{key}"]
    assert "remove this key" in errors[0].reason
    assert schema_errors(config)
    assert main(["run", write_json(tmp_path / "cfg.json", config), "--json", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert f"data_loader.{key}" in captured.err and captured.out == ""


# -- validate knows the value rules that construction enforces ---------------------------


@pytest.mark.timeout(120)
def test_validate_reports_what_run_rejects_and_run_reports_it_all_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    (tmp_path / "corpus.txt").write_text("a b\nc d\n")
    no_loader = {"dataset_reader": "text", "data_path": "corpus.txt"}
    assert [str(e) for e in validate(no_loader)] == [
        "data_loader.batch_size: batch_size is required when batch_sampler is not given"
    ]
    three_wrong = {
        "dataset_reader": {"type": "text", "num_buckets": 2},
        "data_path": "corpus.txt",
        "data_loader": {"batch_sampler": {"type": "bucket", "batch_size": 0}, "num_workers": -1},
    }
    paths = ["dataset_reader.num_buckets", "data_loader.batch_sampler.batch_size", "data_loader.num_workers"]
    assert [e.path for e in validate(three_wrong)] == paths
    assert main(["config", "validate", write_json(tmp_path / "b.json", three_wrong)]) == 1
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == paths
    assert main(["run", write_json(tmp_path / "b.json", three_wrong), "--no-progress"]) == 2
    assert [line.split(": ")[2] for line in capsys.readouterr().err.splitlines()] == paths


# -- a value the loader cannot use fails the check, before any download ------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"batches_per_epoch": 10**23}, "batches_per_epoch must be at most"),
        ({"timeout": float("inf")}, "timeout must be a finite positive number"),
        ({"timeout": float("nan")}, "timeout must be a finite positive number"),
    ],
)
def test_an_unusable_loader_value_fails_validate_and_run_before_the_download(
    setting: dict[str, Any], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    with socket_that_refuses() as url:  # a download attempt would fail differently (exit 1)
        config = {"dataset_reader": "text", "data_path": url, "data_loader": {"batch_size": 1, **setting}}
        errors = validate(config)
        assert [e.path for e in errors] == [f"data_loader.{next(iter(setting))}"]
        assert message in errors[0].reason
        assert main(["run", write_json(tmp_path / "cfg.json", config), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@contextlib.contextmanager
def socket_that_refuses() -> Iterator[str]:
    """A local URL whose port nothing accepts on (bound, not listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/corpus.txt"


# -- config validate prints one line per error -------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("name", "text", "starts"),
    [
        (
            "key.json",
            json.dumps({**LOADER, "bad\nkey": 1, "x.y": 2}),
            ["'bad\\nkey': unknown", "'x.y': unknown"],
        ),
        ("ansi.json", json.dumps({**LOADER, "\x1b[2Jboo": 1}), ["'\\x1b[2Jboo': unknown"]),
        ("bad.yaml", "dataset_reader: text\ndata_path: x\n? [1, 2]\n: 3\n", ["<root>: "]),
        ("typo.yaml", "dataset_reader: {type: text\ndata_path: x\n", ["<root>: "]),
    ],
)
def test_config_validate_prints_each_error_on_one_line(
    name: str, text: str, starts: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text(text)
    assert main(["config", "validate", str(tmp_path / name)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(starts) and all(line.isprintable() for line in lines), lines
    assert [line[: len(start)] for line, start in zip(lines, starts)] == starts


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [1e7, 1e308])
def test_a_long_worker_timeout_that_validate_accepts_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], timeout: float
) -> None:
    # A worker timeout validate() accepts must run: poll() takes at most 2**31-1 ms, so the
    # loader caps a long one (1e7 s, or 1e308) instead of failing with "timeout is too large"
    # or an OverflowError.
    from framework.cli import main

    (tmp_path / "corpus.txt").write_text("a b\nc d\ne f\n")
    loader = {"batch_size": 1, "num_workers": 1, "timeout": timeout}
    config = {"dataset_reader": "text", "data_path": "corpus.txt", "data_loader": loader}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert validate(config) == []
    assert main(["run", str(tmp_path / "config.json"), "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["instances"] == 3
