from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import framework
from framework.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"framework {framework.__version__}"


@pytest.mark.parametrize("command", ["plugins", "download", "cache", "run"])
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert f"usage: framework {command}" in capsys.readouterr().out


def test_no_command_says_so_in_one_line_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "framework: error: give a command: cache, config, download, plugins, run (see framework --help)"
    ]


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["run", "--override"], "framework run: error: argument -o/--override: expected one argument"),
        (["run", "--bogus"], "framework run: error: unrecognized arguments: --bogus"),
        (["bogus"], "framework: error: argument COMMAND: invalid choice: 'bogus'"),
        (["config"], "framework config: error: the following arguments are required: ACTION"),
        (["config", "validate"], "framework config validate: error: the following arguments are required"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(
    args: list[str], prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(args)
    except SystemExit as exit:  # argparse's own errors exit; main returns the others' status
        code = exit.code  # type: ignore[assignment]
    assert code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(prefix) and line.endswith("--help)")


def test_plugins_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["BASE", "NAME", "TARGET", "PROVIDER"]
    rows = [line.split() for line in out[1:]]
    assert ["DataLoader", "multiprocess", "framework.data.multiprocess:MultiProcessDataLoader",
            "framework", framework.__version__] in rows  # fmt: skip
    assert any(row[:2] == ["DownloadBackend", "http"] for row in rows)


def test_plugins_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {(row["base"], row["name"]) for row in data["components"]}
    assert {("BatchSampler", "bucket"), ("BatchSampler", "max_tokens"),
            ("DataCollator", "default"), ("DownloadBackend", "s3")} <= names  # fmt: skip
    assert data["failed_plugins"] == {}


@pytest.mark.timeout(60)
def test_python_dash_m_matches_the_console_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "framework", "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert result.stdout.strip() == f"framework {framework.__version__}"


@pytest.mark.timeout(60)
def test_plugins_command_never_imports_torch_or_components() -> None:
    code = (
        "import sys\n"
        "from framework.cli import main\n"
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['plugins'])\n"
        "heavy = [m for m in ('torch', 'requests', 'boto3', 'framework.data.multiprocess',\n"
        "         'framework_plugins.http', 'framework_plugins.readers') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.timeout(60)
def test_import_framework_does_not_import_torch() -> None:
    code = "import sys, framework\nprint('torch' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "False", result.stderr


REPO_ROOT = Path(__file__).resolve().parent.parent


def run_python(
    site: Path, code: str, *, site_first: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    paths = [str(site), str(REPO_ROOT)] if site_first else [str(REPO_ROOT), str(site)]
    environ["PYTHONPATH"] = os.pathsep.join(paths)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=environ, timeout=60, cwd=site,
    )  # fmt: skip


# -- the command line: relative paths and hostile inputs ---------------------------------


HOSTILE_FILES = {
    "broken.json": '{"dataset_reader": ',
    "list.json": "[1, 2]",
    "typeint.json": '{"dataset_reader": {"type": 5}, "data_path": "x", "data_loader": {"batch_size": 1}}',
    "notutf8.json": b'{"data_path": "\xff\xfe"}',
    "exits.json": '{"dataset_reader": {"type": "exiting_type_mod:Reader"}, "data_path": "x", '
    '"data_loader": {"batch_size": 1}}',
    "raises.json": '{"dataset_reader": {"type": "raising_type_mod:Reader"}, "data_path": "x", '
    '"data_loader": {"batch_size": 1}}',
    "bad.yaml": "dataset_reader: [unclosed\n",
    "exiting_type_mod.py": "import sys\nsys.exit(4)\n",
    "raising_type_mod.py": "raise RuntimeError('boom while importing')\n",
}


@pytest.mark.parametrize(
    "args",
    [
        ["run", "missing.json"],
        ["run", "a_folder"],
        ["run", "broken.json"],
        ["run", "list.json"],
        ["run", "typeint.json"],
        ["run", "notutf8.json"],
        ["run", "bad.yaml"],
        ["run", "exits.json"],
        ["run", "raises.json"],
        ["run", "--override", "not json"],
        ["run", "--override", "[1, 2]"],
        ["run", "--override", '{"data_path": "no_such_file.txt"}'],
        ["download", "gopher://example.org/x"],
        ["download", "no_such_file.bin"],
        ["download", "--sha256", "zz", "raises.json"],
    ],
    ids=lambda args: " ".join(args),
)
def test_every_bad_input_is_one_line_and_a_failure(tmp_path: Path, args: list[str]) -> None:
    for name, content in HOSTILE_FILES.items():
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    (tmp_path / "a_folder").mkdir()
    result = run_python(tmp_path, f"import sys\nfrom framework.cli import main\nsys.exit(main({args!r}))\n")
    lines = result.stderr.splitlines()
    assert result.returncode != 0, result.stdout
    assert len(lines) == 1 and lines[0].startswith("framework "), result.stderr
