#!/usr/bin/env bash
# The benchmarks, in one command: the test set-up (Python packages, Prometheus, the llama-server
# build), Debian's mtail, then each benchmark in turn. Prints figures; nothing passes or fails on
# time. Results and the machine they came from: benchmarks/BENCHMARKS.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tests/setup/setup.sh"
if ! command -v mtail >/dev/null; then
  SUDO=""; [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mtail >&2
fi
if ! command -v valgrind >/dev/null; then
  SUDO=""; [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends valgrind >&2
fi
cd "$ROOT"
echo "== machine"; nproc; grep -m1 "model name" /proc/cpuinfo || true; .venv/bin/python --version; mtail --version 2>&1 | head -1
echo "== throughput next to mtail (one million lines)"; .venv/bin/python benchmarks/throughput_vs_mtail.py
echo "== where a line's time goes, next to twice mtail"; .venv/bin/python benchmarks/hot_path_budget.py --compiled
echo "== instructions per line, compiled (valgrind: independent of the machine's load)"; .venv/bin/python benchmarks/instructions_per_line.py
echo "== the live exporter: memory, scrape cost, freshness"; .venv/bin/python benchmarks/live_exporter.py
echo "== overhead on a real llama-server, with and without the exporter"; .venv/bin/python benchmarks/server_overhead.py
echo "== headroom against the fastest llama-server here"; .venv/bin/python benchmarks/server_log_rate.py
echo "== analyze's memory over ten million lines and over a rotated set"; .venv/bin/python benchmarks/analyze_memory.py
echo "== replay of each recorded log"; .venv/bin/python benchmarks/replay_throughput.py
echo "== /metrics while the pipeline replays"; .venv/bin/python benchmarks/scrape_under_load.py
echo "== many slots: the cost per line at 4, 16, 64 and 128 slots of a real server"; .venv/bin/python benchmarks/many_slots.py --compiled
echo "== many slots live: the exporter following a real 64-slot server"; .venv/bin/python benchmarks/many_slots_live.py
echo "== many slots, memory: 128 slots, 512 conversations, read as one long run"; .venv/bin/python benchmarks/many_slots_memory.py --compiled
echo "== what the conversation join names on every recorded run"; .venv/bin/python benchmarks/join_coverage.py
echo "== sending each request's trace: the hot path with traces off and on"; .venv/bin/python benchmarks/tracing_cost.py
echo "== a compressed day: restarts, kills, rotation, a LoRA scale change (20 minutes)"; .venv/bin/python benchmarks/compressed_day.py
