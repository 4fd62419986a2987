#!/usr/bin/env bash
# Create .venv (once) and install framework with its extras into it.
# torch==2.13.0 goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,s3,fsspec,docs}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
