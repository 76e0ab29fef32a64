#!/usr/bin/env bash
# The project's test command: installs missing build dependencies, builds
# reshard in build/ with warnings as errors and runs every ctest test, then
# installs the Python package into build/py-venv and runs its tests
# (scripts/test_python.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install_deps.sh

jobs=$(nproc)
cmake -S . -B build -DRESHARD_WERROR=ON
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j2
bash scripts/test_python.sh
