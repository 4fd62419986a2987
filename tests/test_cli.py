from __future__ import annotations

import json
import subprocess
import sys

import pytest

import framework
from framework.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"framework {framework.__version__}"


@pytest.mark.parametrize("command", ["plugins", "download", "run"])
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert f"usage: framework {command}" in capsys.readouterr().out


def test_no_command_says_so_in_one_line_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "framework: error: give a command: config, download, plugins, run (see framework --help)"
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
