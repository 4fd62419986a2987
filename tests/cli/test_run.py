"""`framework run`: the bundled default, config files, overrides, and clear errors."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from framework.cli import main
from framework.cli.run import deep_merge, load_run_config
from framework.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_LINES = sum(
    1 for line in (REPO_ROOT / "framework" / "examples" / "corpus.txt").open() if line.strip()
)

pytestmark = pytest.mark.timeout(60)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["run", "--no-progress", "--json", *args])
    out, err = capsys.readouterr()
    summary = json.loads(out) if code == 0 else {}
    return code, summary, err


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text(
        "".join(json.dumps({"x": float(i), "label": i % 2}) + "\n" for i in range(50)),
        encoding="utf-8",
    )
    return path


def write_config(tmp_path: Path, data_path: str, **changes: Any) -> Path:
    config = {
        "dataset_reader": {"type": "jsonl"},
        "data_path": data_path,
        "data_loader": {"type": "multiprocess", "batch_size": 8},
        "epochs": 2,
    }
    config = deep_merge(config, changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_deep_merge() -> None:
    base = {"a": {"b": 1, "c": {"d": 2}}, "e": [1, 2]}
    merged = deep_merge(base, {"a": {"c": {"d": 3, "f": 4}}, "e": [5]})
    assert merged == {"a": {"b": 1, "c": {"d": 3, "f": 4}}, "e": [5]}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "e": [1, 2]}  # not changed in place


def test_default_config_runs_the_bundled_example(
    capsys: pytest.CaptureFixture[str], isolated_cache: Path
) -> None:
    code, summary, err = run_cli(capsys)
    assert code == 0, err
    assert summary["epochs"] == 2
    assert summary["instances"] == 2 * BUNDLED_LINES
    assert summary["batches"] >= summary["instances"] // 32
    assert summary["time_to_first_batch_s"] > 0
    assert summary["cached_at"] == str(REPO_ROOT / "framework" / "examples" / "corpus.txt")
    assert list(isolated_cache.iterdir()) == []  # the bundled corpus is read in place


def test_default_config_through_the_real_command(isolated_cache: Path, cli_env: dict[str, str]) -> None:
    cli_env["FRAMEWORK_CACHE"] = str(isolated_cache)
    result = subprocess.run(
        [sys.executable, "-m", "framework", "run"],
        capture_output=True, text=True, env=cli_env, timeout=50,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for label in ("instances", "batches", "instances/s", "batches/s", "first batch",
                  "peak memory", "cached at"):  # fmt: skip
        assert label in result.stdout
    assert f"instances    {2 * BUNDLED_LINES}" in result.stdout
    assert "cached at    (a local path, read in place)" in result.stdout


def test_json_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path) -> None:
    config = write_config(tmp_path, str(data_file))
    code, summary, err = run_cli(capsys, str(config))
    assert code == 0, err
    assert summary["instances"] == 100 and summary["batches"] == 2 * 7


def test_yaml_config_file_with_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "dataset_reader: {type: jsonl, fields: [x]}\n"
        f"data_path: {data_file}\n"
        "data_loader: {batch_size: 10, num_workers: 2}\n"
        "epochs: 1\n",
        encoding="utf-8",
    )
    code, summary, err = run_cli(capsys, str(config))
    assert code == 0, err
    assert summary["instances"] == 50 and summary["batches"] == 5


def test_overrides_deep_merge(capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path) -> None:
    config = write_config(tmp_path, str(data_file))
    code, summary, err = run_cli(
        capsys, str(config),
        "--override", '{"data_loader": {"batch_size": 25}}',
        "--override", '{"epochs": 3}',
    )  # fmt: skip
    assert code == 0, err
    assert summary["epochs"] == 3 and summary["batches"] == 3 * 2


def test_relative_data_path_is_relative_to_the_current_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, data_file.name)
    monkeypatch.chdir(tmp_path)
    code, summary, err = run_cli(capsys, str(config))
    assert code == 0, err
    assert summary["instances"] == 100


def test_bad_nested_key_names_its_path_and_fetches_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path, isolated_cache: Path
) -> None:
    config = write_config(
        tmp_path,
        str(data_file),
        data_loader={"batch_size": None, "batch_sampler": {"type": "bucket", "batch_size": "ten"}},
    )
    code, _, err = run_cli(capsys, str(config))
    assert code == 2
    assert "data_loader.batch_sampler.batch_size: expected int, got 'ten'" in err
    assert not any(isolated_cache.iterdir()), "a config error must stop before any download"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epoch": 2}, "epoch: unknown top-level key. Did you mean 'epochs'?"),
        ({"epochs": 0}, "epochs: expected a positive int, got 0"),
        ({"dataset_reader": {"type": "jsonl", "fieldz": ["x"]}},
         "dataset_reader.fieldz: unknown key for JsonlReader. Did you mean 'fields'?"),
        ({"dataset_reader": {"type": "jsnol"}}, "dataset_reader.type:"),
        ({"data_loader": {"type": "multiprocess", "batch_size": 8, "num_wrkers": 2}},
         "data_loader.num_wrkers: unknown key"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path, changes: dict[str, Any], message: str
) -> None:
    config = write_config(tmp_path, str(data_file), **changes)
    code, _, err = run_cli(capsys, str(config))
    assert code == 2
    assert message in err


def test_missing_required_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"data_path": "x.jsonl"}', encoding="utf-8")
    code, _, err = run_cli(capsys, str(path))
    assert code == 2 and "dataset_reader: missing required key" in err


def test_bad_override_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--override", "{data_loader: 1}")
    assert code == 2 and "--override #1 is not valid JSON" in err


def test_missing_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read config file" in err and "nope.json" in err


def test_missing_data_file_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write_config(tmp_path, str(tmp_path / "missing.jsonl"))
    code, _, err = run_cli(capsys, str(config))
    assert code == 1
    assert f"data_path: {tmp_path / 'missing.jsonl'} does not exist" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_reader_failing_mid_file_is_one_line_naming_the_original(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path, num_workers: int
) -> None:
    # The same line with or without workers: the original type and message, no traceback.
    with data_file.open("a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    config = write_config(tmp_path, str(data_file), data_loader={"num_workers": num_workers})
    code, _, err = run_cli(capsys, str(config))
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("framework run: error: WorkerError: "), err
    assert "raised ValueError: " in err and "data.jsonl:51: not valid JSON" in err
    assert "Traceback" not in err and "-v" in err


def test_unavailable_device_is_a_config_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path
) -> None:
    import torch

    config = write_config(tmp_path, str(data_file))
    if not torch.cuda.is_available():
        code, _, err = run_cli(capsys, str(config), "--device", "cuda:0")
        assert code == 2 and "--device: cuda:0 asked for, but CUDA is not available" in err
    code, _, err = run_cli(capsys, str(config), "--device", "nonsense")
    assert code == 2 and "--device" in err
    code, summary, err = run_cli(capsys, str(config), "--device", "cpu")
    assert code == 0 and summary["device"] == "cpu", err


def test_url_data_path_is_fetched_once_and_cached(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    data_file: Path,
    http_server: tuple[str, list[str]],
    isolated_cache: Path,
) -> None:
    url, gets = http_server
    (tmp_path / "www" / "data.jsonl").write_bytes(data_file.read_bytes())
    config = write_config(tmp_path, f"{url}/data.jsonl")
    for _ in range(2):
        code, summary, err = run_cli(capsys, str(config))
        assert code == 0, err
        assert summary["instances"] == 100
        assert Path(summary["cached_at"]).is_relative_to(isolated_cache)
    assert gets == ["/data.jsonl"]  # the second run was a cache hit


@pytest.mark.parametrize("as_url", [False, True], ids=["path", "file-url"])
def test_a_local_file_is_read_in_place(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path, isolated_cache: Path, as_url: bool
) -> None:
    """A local file (a path or a ``file://`` URL) is read where it is, never copied."""
    config = write_config(tmp_path, data_file.as_uri() if as_url else str(data_file))
    code, summary, err = run_cli(capsys, str(config))
    assert code == 0, err
    assert summary["instances"] == 100
    assert summary["cached_at"] == str(data_file)
    assert list(isolated_cache.rglob("*")) == []


def test_a_missing_file_url_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_cache: Path
) -> None:
    config = write_config(tmp_path, (tmp_path / "missing.jsonl").as_uri())
    code, _, err = run_cli(capsys, str(config))
    assert code != 0
    assert "missing.jsonl" in err and "does not exist" in err


def test_a_file_url_of_another_host_is_refused_before_any_lock(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_cache: Path
) -> None:
    config = write_config(tmp_path, "file://otherhost/data.jsonl")
    code, _, err = run_cli(capsys, str(config))
    assert code != 0
    assert "another host" in err and "otherhost" in err
    assert list(isolated_cache.rglob("*")) == []  # no lock file left behind


def test_url_that_does_not_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, http_server: tuple[str, list[str]]
) -> None:
    url, _ = http_server
    config = write_config(tmp_path, f"{url}/missing.jsonl")
    code, _, err = run_cli(capsys, str(config))
    assert code == 1
    assert "404" in err and "missing.jsonl" in err


def test_help_lists_the_options() -> None:
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-m", "framework", "run", "--help"],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert result.returncode == 0
    for option in ("--override", "--device", "CONFIG"):
        assert option in result.stdout


def test_lazy_loader_and_a_sampler_by_override(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = tmp_path / "lines.txt"
    text.write_text("".join("word " * (1 + i % 6) + "\n" for i in range(50)), encoding="utf-8")
    config = write_config(tmp_path, str(text), epochs=1, dataset_reader={"type": "text"})
    code, summary, err = run_cli(
        capsys, str(config), "--override",
        '{"data_loader": {"batch_size": null, "num_workers": 2, "max_instances_in_memory": 20,'
        ' "batch_sampler": {"type": "bucket", "batch_size": 5, "sorting_keys": ["tokens"]}}}',
    )  # fmt: skip
    assert code == 0, err
    assert summary["instances"] == 50 and summary["batches"] >= 10


def test_a_bad_combination_is_a_config_error_before_any_download(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path, isolated_cache: Path
) -> None:
    config = write_config(
        tmp_path, str(data_file),
        data_loader={"batch_sampler": {"type": "bucket", "batch_size": 4}},
    )  # fmt: skip
    code, _, err = run_cli(capsys, str(config))
    assert code == 2
    assert "batch_sampler is mutually exclusive with batch_size" in err
    assert err.startswith("framework run: error: data_loader")
    assert not any(isolated_cache.iterdir())


def test_a_local_folder_is_read_in_place(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework import DatasetReader

    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.txt").write_text(f"{i}\n{i + 10}\n", encoding="utf-8")

    class FolderReader(DatasetReader):
        def _read(self, file_path: Any) -> Any:
            for name in sorted(Path(file_path).glob("*.txt")):
                for line in name.read_text().split():
                    yield {"n": int(line)}

    DatasetReader.register("folder-of-numbers-test")(FolderReader)
    config = write_config(tmp_path, str(folder), dataset_reader={"type": "folder-of-numbers-test"}, epochs=1)
    code, summary, err = run_cli(capsys, str(config))
    assert code == 0, err
    assert summary["instances"] == 6 and summary["cached_at"] == str(folder)


def test_ctrl_c_stops_cleanly(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """Ctrl-C once the workers are reading: exit 130 with one line, and no worker left."""
    import signal
    import time

    from tests.support.loader import alive

    pids = tmp_path / "pids"
    pids.mkdir()
    (tmp_path / "slow_tokenizer.py").write_text(
        "import os, time\n"
        f"PIDS = {str(pids)!r}\n\n"
        "def tokenize(text):\n"
        "    open(os.path.join(PIDS, str(os.getpid())), 'a').close()\n"
        "    time.sleep(0.02)\n"
        "    return text.split()\n"
    )
    text = tmp_path / "lines.txt"
    text.write_text("a b c\n" * 2000, encoding="utf-8")
    config = write_config(
        tmp_path, str(text),
        dataset_reader={"type": "text", "tokenizer": "slow_tokenizer:tokenize"},
        data_loader={"num_workers": 2, "max_instances_in_memory": 16},
    )  # fmt: skip
    cli_env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), cli_env["PYTHONPATH"]])
    cli_env["FRAMEWORK_CACHE"] = str(tmp_path / "cache")
    process = subprocess.Popen(
        [sys.executable, "-m", "framework", "run", str(config), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env,
    )  # fmt: skip
    workers: set[int] = set()

    def kill(pids: Any) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    try:
        deadline = time.monotonic() + 60  # start-up imports torch: seconds on a busy machine
        while len(list(pids.iterdir())) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = {int(path.name) for path in pids.iterdir()}
        if len(workers) != 2 or process.poll() is not None:
            kill([*workers, process.pid])
            process.wait(timeout=10)
            pytest.fail(f"the run did not start both workers: {sorted(workers)}; {process.stderr.read()}")
        assert process.pid not in workers  # the tokenizer runs in the workers
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            kill([*workers, process.pid])
            process.wait(timeout=10)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in workers if alive(pid)]
    kill(left)  # they hold the run's pipes: read its stderr once they are gone
    _, err = process.communicate(timeout=10)
    assert process.returncode == 130, err
    assert "framework run: error: interrupted" in err
    assert not left, "a worker outlived the interrupted run"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("written", "override", "merged"),
    [
        ("text", {"lowercase": True}, {"type": "text", "lowercase": True}),
        ("text", {"type": "jsonl"}, {"type": "jsonl"}),  # a new component replaces it
        ("text", "jsonl", "jsonl"),
    ],
)
def test_an_override_merges_into_a_component_written_as_its_name(
    tmp_path: Path, written: str, override: Any, merged: Any
) -> None:
    # An override of a component written as its name ("text" is {"type": "text"}) merges
    # into it: replacing it would leave no "type" and fail the run.
    file = tmp_path / "config.json"
    file.write_text(
        json.dumps({"dataset_reader": written, "data_path": "x", "data_loader": {"batch_size": 1}})
    )
    config, _ = load_run_config(str(file), [json.dumps({"dataset_reader": override})])
    assert config["dataset_reader"] == merged


@pytest.mark.timeout(120)
def test_a_data_path_of_an_unknown_user_is_a_config_error(tmp_path: Path) -> None:
    # "~no_such_user_zz/x" cannot be expanded: a ConfigError before the run, not a
    # RuntimeError from Path.expanduser after the config was called valid.
    from framework.cli.run import _resolve_data_path

    with pytest.raises(ConfigError, match=r"^data_path: cannot expand '~no_such_user_zz/x'"):
        _resolve_data_path("~no_such_user_zz/x", tmp_path)
    assert _resolve_data_path("data.txt", tmp_path) == str(tmp_path / "data.txt")


# -- the command line: relative paths and hostile inputs ---------------------------------


def _summary(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    from framework.cli import main

    code = main(["run", "--no-progress", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary: dict[str, Any] = json.loads(out)
    return summary


@pytest.mark.timeout(120)
def test_a_relative_data_path_in_an_override_is_relative_to_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.txt").write_text("one two\nthree four\nfive\n")
    monkeypatch.chdir(tmp_path)
    override = '{"data_path": "mine.txt", "epochs": 1, "data_loader": {"num_workers": 0}}'
    summary = _summary(capsys, "--override", override)
    assert summary["data_path"] == str(tmp_path / "mine.txt") and summary["instances"] == 3


@pytest.mark.timeout(120)
def test_a_relative_data_path_in_a_config_file_is_relative_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "lines.txt").write_text("a\nb\n")
    config = {"dataset_reader": {"type": "text"}, "data_path": "lines.txt",
              "data_loader": {"batch_size": 1}}  # fmt: skip
    (project / "config.json").write_text(json.dumps(config))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    summary = _summary(capsys, str(Path("..") / "project" / "config.json"))
    assert summary["data_path"] == str(project / "lines.txt") and summary["instances"] == 2


@pytest.mark.parametrize("form", ["brace", "list", "manifest"])
def test_shards_named_in_a_config_stream_through_the_cache(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    http_server: tuple[str, list[str]],
    isolated_cache: Path,
    form: str,
) -> None:
    url, gets = http_server
    names = [f"part-{index:02d}.jsonl.gz" for index in range(12)]
    for index, name in enumerate(names):
        lines = "".join(json.dumps({"x": float(index * 10 + k), "label": k % 2}) + "\n" for k in range(10))
        (tmp_path / "www" / name).write_bytes(gzip.compress(lines.encode(), mtime=0))
    (tmp_path / "www" / "list.txt").write_text("".join(f"{name}\n" for name in names))
    data_path: Any = {
        "brace": f"{url}/part-{{00..11}}.jsonl.gz",
        "list": [f"{url}/{name}" for name in names],
        "manifest": f"manifest:{url}/list.txt",
    }[form]
    config = write_config(
        tmp_path,
        data_path,
        data_loader={"num_workers": 2, "max_instances_in_memory": 16, "cache_limit": "1MB", "prefetch": 1},
    )
    for _ in range(2):
        code, summary, err = run_cli(capsys, str(config))
        assert code == 0, err
        assert summary["instances"] == 2 * 120  # two epochs of every record
        assert str(isolated_cache) in summary["cached_at"]
    assert sorted(path for path in gets if path.endswith(".gz")) == sorted(f"/{name}" for name in names)
