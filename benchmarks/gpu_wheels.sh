#!/usr/bin/env bash
# Wheels the GPU machine lacks (it has no network), for benchmarks/gpu_check.sh: into .whl/.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl "gguf>=0.10" platformdirs
ls -l .whl
