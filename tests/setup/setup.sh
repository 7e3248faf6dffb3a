#!/usr/bin/env bash
# Everything the tests and the demo need, on a fresh Debian machine, idempotent:
# Debian packages (promtool, a C++ toolchain), the Python environment (.venv), the
# llama-server builds (cached under ~/.cache/llamacpp-exporter, about 5 minutes each the first
# time: b11434, and b11549 as released and with the LoRA comparison fixed), the model and the
# LoRA adapter.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${LLAMACPP_EXPORTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamacpp-exporter}"
export LLAMACPP_EXPORTER_CACHE="$CACHE"
SUDO=""; [[ "$(id -u)" == 0 ]] || SUDO="sudo"

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v amtool >/dev/null || missing+=(prometheus-alertmanager)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v patch >/dev/null || missing+=(patch)                    # the tests' b11549 with the LoRA comparison fixed
command -v docker-compose >/dev/null || missing+=(docker-compose)  # `config` validates the compose files, no engine
command -v busybox >/dev/null || missing+=(busybox)                # runs deploy/logrotate/rotate.sh as its image does
command -v openssl >/dev/null || missing+=(openssl)                # certificates for the TLS test
command -v npm >/dev/null || missing+=(nodejs npm)                 # the Prometheus and Grafana Operators' schemas
command -v jsonnet >/dev/null || missing+=(jsonnet)                # evaluates the jsonnet mixin (llamacpp-mixin/)
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# kubectl kustomize renders deploy/kubernetes: Debian's kubectl from trixie on (bookworm's
# kubernetes-client is kubectl 1.20, whose kustomize has no components). Where no package has
# it, the rest of the set-up goes on and test_deploy.py's kustomize test says what is missing.
if ! command -v kubectl >/dev/null; then
  $SUDO apt-get install -y -qq --no-install-recommends kubectl >&2 \
    || echo "setup: no kubectl package here (Debian has it from trixie on); install kubectl >= 1.21" >&2
fi

PY="${PYTHON:-python3}"
if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
  echo "setup: creating $ROOT/.venv" >&2
  "$PY" -m venv "$ROOT/.venv"
fi
# the development install is the pure source (edits take effect at once); tests/test_compiled.py
# builds the package as `pip install .` does, compiled, and checks it against the source
LLAMACPP_EXPORTER_COMPILE=0 "$ROOT/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[test]" >&2

# The Prometheus Operator's and the Grafana Operator's CRD schemas with a validator
# (kubernetes-models, from the npm registry; grafana-operator 3.0.0 holds the operator's v5.22 CRDs)
NODE_DIR="$CACHE/node"
for pkg in prometheus-operator@6.0.0 grafana-operator@3.0.0; do
  if [[ ! -d "$NODE_DIR/node_modules/@kubernetes-models/${pkg%@*}" ]]; then
    echo "setup: installing @kubernetes-models/$pkg into $NODE_DIR" >&2
    mkdir -p "$NODE_DIR"
    npm install --prefix "$NODE_DIR" --no-audit --no-fund --silent "@kubernetes-models/$pkg" >&2
  fi
done

PYTHON="$ROOT/.venv/bin/python" bash "$ROOT/tests/setup/build_llama_server.sh" >/dev/null
# b11549 as released and with the LoRA comparison fixed (tests/test_lora_fixed_real.py)
for patch in "" "$ROOT/tests/setup/patches/xllamacpp-2026.10.11549-lora-restore-fix.patch"; do
  LLAMA_SERVER_SDIST=xllamacpp==2026.10.11549 LLAMA_SERVER_PATCH="$patch" PYTHON="$ROOT/.venv/bin/python" \
    bash "$ROOT/tests/setup/build_llama_server.sh" >/dev/null
done
"$ROOT/.venv/bin/python" "$ROOT/tests/setup/make_model.py" "$CACHE/models" >/dev/null
echo "setup: ready (llama-server, model and adapter cached in $CACHE)" >&2
