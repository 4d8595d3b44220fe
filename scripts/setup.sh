#!/usr/bin/env bash
# Install ios-ray (editable) with its test and plotting tools. Keeps the torch already installed where it is in the
# range pyproject.toml pins (the tested one); otherwise installs torch==2.13.0, which on a machine without a GPU is
# the CPU build (never an unpinned torch: that pulls CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip --version >/dev/null
# 0: torch is installed and in range; 1: not installed; 2: installed, out of range (pip's own packaging reads the range)
torch_state=0
python3 - <<'EOF' || torch_state=$?
import re, sys
from pathlib import Path
from pip._vendor.packaging.specifiers import SpecifierSet
try:
    import torch
except ImportError:
    sys.exit(1)
wanted = SpecifierSet(re.search(r'"torch([^"]*)"', Path("pyproject.toml").read_text()).group(1))
sys.exit(0 if wanted.contains(torch.__version__.split("+")[0], prereleases=True) else 2)
EOF
if [ "$torch_state" -ne 0 ]; then
    [ "$torch_state" -eq 2 ] && echo "setup: torch $(python3 -c 'import torch; print(torch.__version__)') is outside the tested range (pyproject.toml)"
    echo "setup: installing torch==2.13.0"
    python3 -m pip install -q --root-user-action=ignore torch==2.13.0
fi
python3 -m pip install -q --root-user-action=ignore -e ".[dev]"
python3 -c "import ios_ray.cli" && echo "setup: ios-ray $(python3 -m pip show ios-ray | awk '/^Version/{print $2}') ready"
