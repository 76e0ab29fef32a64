#!/usr/bin/env bash
# The main job: installs missing dependencies, builds reshard and runs a
# real RL weight sync on 8 MPI ranks of this machine: a Qwen2.5-0.5B-shaped
# model (4 of its 24 layers) goes from Megatron TP2 x PP2 (ranks 0-3) to
# vLLM TP2 x DP2 (ranks 4-7) for 5 steps, every element checked.
# Extra arguments go to the example (see examples/rl_weight_sync.c), e.g.
#   bash scripts/demo.sh --layers 24 --steps 3
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install_deps.sh

cmake -S . -B build -DRESHARD_WITH_MPI=ON >/dev/null
cmake --build build -j"$(nproc)" --target rl_weight_sync quickstart
./build/examples/quickstart
# Open MPI refuses root without these; 8 ranks on fewer cores needs
# oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 8 --oversubscribe ./build/examples/rl_weight_sync \
  --model-config configs/Qwen2.5-0.5B.json --layers 4 \
  --train tp=2,pp=2 --infer tp=2,dp=2 "$@"
