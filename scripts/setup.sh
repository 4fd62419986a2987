#!/usr/bin/env bash
# Create .venv (once) and install framework with its extras into it.
# torch==2.13.0 goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,s3,fsspec,zstd,docs}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
# setuptools warns on every editable install of a project whose packages it maps (here
# framework_plugins is plugins/) that a folder named like a package in the working
# folder may shadow the install. Here framework/ IS the installed code, so that one
# warning is ignored; every other warning and error still shows.
PYTHONWARNINGS="ignore:Editable installation.:UserWarning" \
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
