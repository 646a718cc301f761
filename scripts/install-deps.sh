#!/usr/bin/env bash
# Installs the Debian 12 packages DeepInfer builds against. Safe to re-run.
# Usage: scripts/install-deps.sh            (uses sudo when not root)
set -euo pipefail

packages=(
    build-essential cmake ccache pkg-config
    nlohmann-json3-dev libfmt-dev libcxxopts-dev
    libopenblas-dev
    libpcre2-dev libutf8proc-dev libxxhash-dev zlib1g-dev
    libgtest-dev libgmock-dev libbenchmark-dev
    pybind11-dev python3-dev
)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all packages present"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
