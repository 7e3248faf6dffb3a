#!/usr/bin/env bash
# The test command: set everything up (see tests/setup/setup.sh), then run the whole suite.
# Extra arguments go to pytest, e.g. tests/run.sh -k golden --update-golden
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tests/setup/setup.sh"
cd "$ROOT"
exec .venv/bin/python -m pytest "$@"
