#!/usr/bin/env bash
# The demo command: set up, start a real llama-server and the exporter, run a short
# workload and print what the exporter reports. Arguments go to tests/demo.py (--keep).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tests/setup/setup.sh"
exec "$ROOT/.venv/bin/python" "$ROOT/tests/demo.py" "$@"
