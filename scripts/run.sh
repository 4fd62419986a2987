#!/usr/bin/env bash
# Set up, then run the main job: `framework run` on its embedded default config
# (any arguments are passed on, e.g. a config file or --override).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh s3
.venv/bin/framework run "$@"
