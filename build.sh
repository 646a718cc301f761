#!/usr/bin/env bash
# Builds DeepInfer into ./build (binaries in ./build/bin), installing the Debian packages it needs first.
#   DEEPINFER_ACCELERATOR=cpu|nvidia   (default: nvidia when nvcc is found, else cpu)
#   DEEPINFER_BUILD_DIR=DIR            (default: build)
#   DEEPINFER_BUILD_TYPE=Release|Debug|RelWithDebInfo   (default: Release)
# Extra arguments are passed to CMake's configure step (e.g. -DDI_SANITIZE=ON).
set -euo pipefail
cd "$(dirname "$0")"

scripts/install-deps.sh

accelerator="${DEEPINFER_ACCELERATOR:-}"
if [ -z "$accelerator" ]; then
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then accelerator=nvidia; else accelerator=cpu; fi
fi
case "$accelerator" in
    cpu) cuda=OFF ;;
    nvidia)
        cuda=ON
        if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
        ;;
    *) echo "build.sh: DEEPINFER_ACCELERATOR must be cpu or nvidia, not '$accelerator'" >&2; exit 2 ;;
esac

build_dir="${DEEPINFER_BUILD_DIR:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
echo "build.sh: accelerator=$accelerator (DI_CUDA=$cuda), build dir $build_dir, $jobs jobs"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${DEEPINFER_BUILD_TYPE:-Release}" -DDI_CUDA="$cuda" "$@"
cmake --build "$build_dir" -j "$jobs"
echo "build.sh: done; the CLI is $build_dir/bin/deepinfer"
