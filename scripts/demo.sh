#!/usr/bin/env bash
# The main job: installs missing build dependencies, builds reshard and runs
# an RL weight sync (Megatron TP2 x PP2 -> vLLM TP2 x DP2, Qwen2.5-0.5B
# shapes, 8 ranks as threads), checking every element of every step.
# Extra arguments go to the example (--layers N --steps K --staging MiB).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install_deps.sh

cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)" --target weight_sync_inproc quickstart
./build/examples/quickstart
./build/examples/weight_sync_inproc "$@"
