#!/usr/bin/env bash
# Set up, then run every check CI runs: lint, types, tests, docs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,s3,fsspec,zstd,docs
export PATH="$PWD/.venv/bin:$PATH"
export NO_MKDOCS_2_WARNING=1

echo "== ruff"
ruff check .
echo "== mypy (strict on framework/)"
mypy
echo "== import layers (import-linter; contracts in pyproject.toml)"
lint-imports --no-cache
echo "== pytest"
status=0
# Three processes, one test file each at a time: most tests wait on worker processes,
# servers and process groups (two processes left a third of the 2 cores idle). Bytecode
# is written even where the environment says not to: every spawned interpreter would
# otherwise compile the package again, and pytest rewrite every test module again.
unset PYTHONDONTWRITEBYTECODE
pytest -q -n 3 --dist loadfile --durations=20 "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
elif [ "$status" -ne 0 ]; then
  exit "$status"
fi
echo "== docs (mkdocs build --strict)"
if [ -f mkdocs.yml ]; then
  mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
else
  echo "mkdocs.yml is missing" >&2
  exit 1
fi
