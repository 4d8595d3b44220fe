#!/usr/bin/env bash
# Install ios-ray (editable) with its test tools. Uses the torch already installed; otherwise installs
# torch==2.13.0, which on a machine without a GPU is the CPU build (never an unpinned torch: that pulls CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip --version >/dev/null
if ! python3 -c "import torch" 2>/dev/null; then
    echo "setup: installing torch==2.13.0"
    python3 -m pip install -q torch==2.13.0
fi
python3 -m pip install -q -e ".[dev]" 2>&1 | grep -v "Running pip as the 'root' user" || true
python3 -c "import ios_ray.cli" && echo "setup: ios-ray $(python3 -m pip show ios-ray | awk '/^Version/{print $2}') ready"
