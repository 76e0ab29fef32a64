#!/usr/bin/env bash
# The GPU backend's check on a machine with a GPU (one H200 in CI; under 8
# minutes): builds the kernels for sm_90 only, runs the GPU tests (kernels
# against the host reference, a one-rank NCCL plan with the real NCCL's
# split, finalize, group probe and a plan created behind a GPU backlog),
# compute-sanitizer memcheck on a small kernel case, the CPU-side GPU
# tests, a bandwidth table of pack/unpack against cudaMemcpy, and (where
# MPI is installed) one checked reshard_perf --backend nccl run on one
# rank, checked reshard_perf --backend ipc runs of 2, 4 and 8 processes on
# the GPU, a timed 2-process IPC sync and a stopped IPC rank, and the same
# over --backend ucx-cuda (GPU memory over UCX: moved by the UCX of
# build-ucx-cu13/ where it was carried, scripts/ucx_cuda_prefix.sh, else
# bounced through host memory by Debian's); prints a summary last.
#   scripts/gpu_check.sh [build-dir]      (default: build-gpucheck)
# A bare GPU machine that cannot reach a package mirror may lack Jansson
# (the model front-end) and CMocka: .deb files of them placed in .gpu/
# beforehand (apt-get download libjansson4 libjansson-dev libcmocka0
# libcmocka-dev) are unpacked into / when the headers are missing.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpucheck}
JOBS=$(nproc 2>/dev/null || echo 4)
export PATH=/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer:$PATH
START=$(date +%s)
declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-34s %s' "$1" "$2")"); }
step() { # name timeout cmd...: runs, records PASS/FAIL/SKIP
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  local t0=$(date +%s)
  timeout "$limit" "$@"
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  case $rc in
    0) note "$name" "PASS (${dt}s)" ;;
    77) note "$name" "SKIP (no device)" ;;
    124) note "$name" "FAIL (timeout ${limit}s)" ;;
    *) note "$name" "FAIL (rc $rc, ${dt}s)" ;;
  esac
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: no GPU visible"

if [ ! -e /usr/include/jansson.h ] && ls .gpu/*.deb >/dev/null 2>&1; then
  for deb in .gpu/*.deb; do dpkg -x "$deb" /; done
  ldconfig
fi

# NCCL: under the CUDA installation here; on a machine where it only comes
# with Python's nvidia-nccl wheel (libnccl.so.2, no libnccl.so), point CMake
# at that library, and at a carried .gpu/include/nccl.h if the wheel has no
# header.
NCCL_ARGS=()
if [ ! -e /usr/local/cuda/include/nccl.h ] && [ -z "${NCCL_HOME:-}" ]; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  NCCL_LIB=$(ls "$NCCL_DIR"/lib/libnccl.so* 2>/dev/null | head -n 1)
  NCCL_INC="$NCCL_DIR/include"
  [ -e "$NCCL_INC/nccl.h" ] || NCCL_INC="$PWD/.gpu/include"
  echo "NCCL from the Python wheel: ${NCCL_LIB:-none}, headers $NCCL_INC"
  [ -n "$NCCL_LIB" ] && NCCL_ARGS=(-DRESHARD_NCCL_LIBRARY="$NCCL_LIB" -DRESHARD_NCCL_INCLUDE_DIR="$NCCL_INC")
fi

# GPU memory over UCX (reshard_comm_create_ucx_cuda) is moved by UCX itself
# only where UCX is CUDA-enabled, which Debian's is not (it bounces through
# host memory there): the libucx-cu13 wheel's UCX, laid out as a prefix
# by scripts/ucx_cuda_prefix.sh where PyPI is reachable and carried here as
# build-ucx-cu13/ (RESHARD_UCX_PREFIX: another place). The build then
# compiles against it and every program runs with it (LD_LIBRARY_PATH).
UCX_PREFIX=${RESHARD_UCX_PREFIX:-build-ucx-cu13}
UCX_CUDA=0
if [ -e "$UCX_PREFIX/lib/pkgconfig/ucx.pc" ]; then
  UCX_CUDA=1
  export PKG_CONFIG_PATH="$(cd "$UCX_PREFIX" && pwd)/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$(cd "$UCX_PREFIX" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "UCX with CUDA from $UCX_PREFIX ($(sed -n 's/^Version: *//p' "$UCX_PREFIX/lib/pkgconfig/ucx.pc"))"
fi

# CMocka may be missing on the GPU machine: then only the GPU programs.
mkdir -p "$BUILD"
TESTS=ON
pkg-config --exists cmocka 2>/dev/null || TESTS=OFF
# MPI only for reshard_perf (its NCCL backend bootstraps over MPI).
MPI=OFF
command -v mpicc >/dev/null && command -v mpirun >/dev/null && MPI=ON
step configure 180 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DRESHARD_WITH_CUDA=ON \
  -DRESHARD_WITH_MPI=$MPI -DRESHARD_CUDA_ARCHITECTURES=90 -DRESHARD_BUILD_TESTS=$TESTS \
  -DRESHARD_BUILD_GPU_TESTS=ON "${NCCL_ARGS[@]}" >"$BUILD/configure.log" 2>&1 || cat "$BUILD/configure.log"
TARGETS="gpu_kernels gpu_nccl_local gpu_bandwidth"
[ "$TESTS" = ON ] && TARGETS="$TARGETS test_gpu_tiles_emul test_gpu_nccl_mock test_gpu_nccl_hazards test_gpu_cuda_ipc test_gpu_graphs test_gpu_spread"
UCX_BUILT=OFF
grep -q '^RESHARD_WITH_UCX:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && UCX_BUILT=ON
[ "$TESTS" = ON ] && [ "$UCX_BUILT" = ON ] && TARGETS="$TARGETS test_gpu_ucx_cuda"
[ "$MPI" = ON ] && TARGETS="$TARGETS reshard_perf"
step build 300 cmake --build "$BUILD" -j "$JOBS" --target $TARGETS

if [ -x "$BUILD/gpu_kernels" ]; then
  step "kernels vs host reference" 120 "$BUILD/gpu_kernels"
  step "one-rank NCCL plan, its CUDA graphs" 120 "$BUILD/gpu_nccl_local"
  if command -v compute-sanitizer >/dev/null; then
    step "memcheck (kernels, small)" 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$BUILD/gpu_kernels" --small 12345
  else
    note "memcheck" "SKIP (no compute-sanitizer)"
  fi
  if [ "$TESTS" = ON ]; then
    step "CPU emulation of the tiles" 60 "$BUILD/test_gpu_tiles_emul"
    step "NCCL transport (mocked)" 60 "$BUILD/test_gpu_nccl_mock"
    step "NCCL multi-rank hazards (emulated)" 120 "$BUILD/test_gpu_nccl_hazards"
    step "CUDA IPC transport (emulated)" 120 "$BUILD/test_gpu_cuda_ipc"
    step "CUDA graphs (emulated)" 120 "$BUILD/test_gpu_graphs"
    step "source-side spreading (emulated)" 120 "$BUILD/test_gpu_spread"
    [ -x "$BUILD/test_gpu_ucx_cuda" ] && step "UCX (CUDA) transport (emulated)" 120 "$BUILD/test_gpu_ucx_cuda"
  fi
  step "bandwidth" 120 "$BUILD/gpu_bandwidth"
  # One rank, colocated, training -> inference layout of two Qwen2.5-0.5B
  # layers at tp=1: no NCCL transfer, but every tensor copied on the device
  # (fused QKV / gate-up split apart), checked element by element (-c 1).
  if [ ! -x "$BUILD/tools/reshard_perf" ]; then
    note "reshard_perf --backend nccl" "SKIP (no MPI: not built)"
  elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    note "reshard_perf --backend nccl" "SKIP (no device)"
  else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    PERF_LOG="$BUILD/perf_nccl.log"
    step "reshard_perf --backend nccl" 180 bash -c 'mpirun -np 1 "$0" --backend nccl --colocate \
      --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=1 --infer tp=1 -c 1 -n 20 -w 5 \
      2>&1 | tee "$1"; exit "${PIPESTATUS[0]}"' "$BUILD/tools/reshard_perf" "$PERF_LOG"
    note "  its final line" "$(grep '^# reshard_perf:' "$PERF_LOG" | tail -n 1)"
    # The CUDA IPC transport, several processes on the one GPU (issue 16):
    # Megatron -> vLLM syncs with disjoint trainer and inference ranks,
    # every element checked (registered buffers: direct copies), then a
    # 2-process sync of Qwen3-8B (4 layers, 4.0 GB, the issue's colocated
    # target) timed (-c 0), registered and staged, to compare with
    # gpu_bandwidth's cudaMemcpy device to device.
    for np in 2 4 8; do
      half=$((np / 2))
      step "reshard_perf --backend ipc -np $np" 150 mpirun -np $np --oversubscribe "$BUILD/tools/reshard_perf" \
        --backend ipc --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=$half --infer tp=$half \
        -c 1 -n 5 -w 2
    done
    # colocated: each process both a trainer and an inference rank
    step "reshard_perf --backend ipc -np 4, colocated" 150 mpirun -np 4 --oversubscribe "$BUILD/tools/reshard_perf" \
      --backend ipc --colocate --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2,pp=2 --infer tp=2,dp=2 \
      -c 1 -n 5 -w 2
    step "reshard_perf --backend ipc -np 4, staged" 150 env RESHARD_PERF_IPC_STAGED=1 mpirun -np 4 --oversubscribe \
      "$BUILD/tools/reshard_perf" --backend ipc --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2 \
      --infer tp=2 -c 1 -n 5 -w 2
    # issue 17 on the GPU: relays (two inference replicas, every part
    # relayed), verify's kernels (the "verify" row is checked too), and
    # compute-sanitizer memcheck on a 2-process sync
    step "reshard_perf --backend ipc, relays" 150 env RESHARD_RELAY=1 mpirun -np 4 --oversubscribe \
      "$BUILD/tools/reshard_perf" --backend ipc --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2 \
      --infer tp=1,dp=2 -c 1 -n 5 -w 2
    step "reshard_perf --backend ipc --verify" 150 env RESHARD_PERF_IPC_STAGED=1 mpirun -np 4 --oversubscribe \
      "$BUILD/tools/reshard_perf" --backend ipc --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2 \
      --infer tp=2 -c 1 -n 5 -w 2 --verify
    # issue 17 item 6 on the GPU: each execute captured into a CUDA graph
    # at its second call and launched from then on (RESHARD_PERF_GRAPH=1),
    # registered, then staged with relays; every element checked
    step "reshard_perf --backend ipc, CUDA graphs" 150 env RESHARD_PERF_GRAPH=1 mpirun -np 4 --oversubscribe \
      "$BUILD/tools/reshard_perf" --backend ipc --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2 \
      --infer tp=2 -c 1 -n 5 -w 2
    step "reshard_perf --backend ipc, CUDA graphs, staged relays" 150 env RESHARD_PERF_GRAPH=1 \
      RESHARD_PERF_IPC_STAGED=1 RESHARD_RELAY=1 mpirun -np 4 --oversubscribe "$BUILD/tools/reshard_perf" \
      --backend ipc --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2 --infer tp=1,dp=2 -c 1 -n 5 -w 2
    # issue 19 on the GPU: casts in the pack and unpack kernels (staged:
    # registered buffers refuse casts), every element checked against the
    # self-test's reference casts
    for dt in bf16 fp8e4m3; do
      step "reshard_perf --backend ipc, f32 -> $dt" 120 env RESHARD_PERF_IPC_STAGED=1 mpirun -np 4 --oversubscribe \
        "$BUILD/tools/reshard_perf" --backend ipc --shape 4096,4096 --src-mesh 2 --src-placements S0 --dst-mesh 2 \
        --dst-placements S1 --dst-dtype $dt -c 1 -n 5 -w 2
    done
    # fp8 block quantization on the device: the quantize kernel, and the
    # pre-plan gathering blocks split across source ranks (TP2 splits
    # 896 rows into 448, not a multiple of 128; vLLM at tp=1, since 128-row
    # scales cannot be cut like 64-row heads); registered (codes read from
    # the quantizing rank's scratch) and staged; every code and scale
    # checked
    for staged in 0 1; do
      step "reshard_perf --backend ipc, bf16 -> fp8 blocks (staged $staged)" 150 env RESHARD_PERF_IPC_STAGED=$staged \
        mpirun -np 4 --oversubscribe "$BUILD/tools/reshard_perf" --backend ipc \
        --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2 --infer tp=1,dp=2 --infer-dtype fp8e4m3 \
        --block 128,128 -c 1 -n 5 -w 2
    done
    if command -v compute-sanitizer >/dev/null; then
      step "memcheck (IPC, 2 processes)" 240 mpirun -np 2 --oversubscribe compute-sanitizer --tool memcheck \
        --error-exitcode 1 "$BUILD/tools/reshard_perf" --backend ipc --model-config configs/Qwen2.5-0.5B.json \
        --layers 1 --train tp=1 --infer tp=1 -c 1 -n 1 -w 0
    fi
    IPC_LOG="$BUILD/perf_ipc.log"
    step "reshard_perf --backend ipc, Qwen3-8B" 180 bash -c 'mpirun -np 2 "$0" --backend ipc \
      --model-config configs/Qwen3-8B.json --layers 4 --train tp=1 --infer tp=1 -c 0 -n 10 -w 3 \
      2>&1 | tee "$1"; exit "${PIPESTATUS[0]}"' "$BUILD/tools/reshard_perf" "$IPC_LOG"
    note "  its final line" "$(grep '^# reshard_perf:' "$IPC_LOG" | tail -n 1)"
    # the same through staging (pack, pull from the sender's pool, unpack)
    IPC_STAGED_LOG="$BUILD/perf_ipc_staged.log"
    step "reshard_perf --backend ipc, staged" 180 bash -c 'RESHARD_PERF_IPC_STAGED=1 mpirun -np 2 "$0" \
      --backend ipc --model-config configs/Qwen3-8B.json --layers 4 --train tp=1 --infer tp=1 -c 0 -n 10 -w 3 \
      2>&1 | tee "$1"; exit "${PIPESTATUS[0]}"' "$BUILD/tools/reshard_perf" "$IPC_STAGED_LOG"
    note "  its final line" "$(grep '^# reshard_perf:' "$IPC_STAGED_LOG" | tail -n 1)"
    # GPU memory over UCX (issue 46): the staging pool's device memory in
    # UCP tagged messages (cuda_ipc between the processes on the one GPU;
    # without build-ucx-cu13, Debian's UCX bounces them through pinned host
    # memory), every element checked, then the timed Qwen3-8B sync beside
    # IPC's
    UCX_WHICH=$([ "$UCX_CUDA" = 1 ] && echo "CUDA-enabled UCX" || echo "bounced through host memory")
    if [ "$UCX_BUILT" != ON ]; then
      note "reshard_perf --backend ucx-cuda" "SKIP (no UCX in this build)"
    else
      for np in 2 4; do
        half=$((np / 2))
        step "ucx-cuda -np $np ($UCX_WHICH)" 150 mpirun -np $np --oversubscribe -x LD_LIBRARY_PATH \
          "$BUILD/tools/reshard_perf" --backend ucx-cuda --model-config configs/Qwen2.5-0.5B.json --layers 2 \
          --train tp=$half --infer tp=$half -c 1 -n 5 -w 2
      done
      step "ucx-cuda, relays" 150 env RESHARD_RELAY=1 mpirun -np 4 --oversubscribe \
        -x LD_LIBRARY_PATH -x RESHARD_RELAY "$BUILD/tools/reshard_perf" --backend ucx-cuda \
        --model-config configs/Qwen2.5-0.5B.json --layers 2 --train tp=2 --infer tp=1,dp=2 -c 1 -n 5 -w 2
      UCX_LOG="$BUILD/perf_ucx_cuda.log"
      step "ucx-cuda, Qwen3-8B" 180 bash -c 'mpirun -np 2 -x LD_LIBRARY_PATH "$0" \
        --backend ucx-cuda --model-config configs/Qwen3-8B.json --layers 4 --train tp=1 --infer tp=1 -c 0 -n 10 \
        -w 3 2>&1 | tee "$1"; exit "${PIPESTATUS[0]}"' "$BUILD/tools/reshard_perf" "$UCX_LOG"
      note "  its final line" "$(grep '^# reshard_perf:' "$UCX_LOG" | tail -n 1)"
      step "UCX (CUDA): a stopped rank ends the job" 90 bash tests/mpi/stopped_rank.sh "# plan:" -- \
        mpirun -np 4 --oversubscribe -x LD_LIBRARY_PATH "$BUILD/tools/reshard_perf" --backend ucx-cuda \
        --shape 4096,4096 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 -n 1000000 -w 1 -c 0
      [ "$UCX_CUDA" = 1 ] || note "  (CUDA-enabled UCX)" "SKIP (no $UCX_PREFIX: run scripts/ucx_cuda_prefix.sh and carry it)"
    fi
    # a process stopped mid-run: the others end the job, non-zero, within
    # the deadline (their waits on the GPU give up), no hang
    step "IPC: a stopped rank ends the job" 90 bash tests/mpi/stopped_rank.sh "# plan:" -- \
      mpirun -np 4 --oversubscribe "$BUILD/tools/reshard_perf" --backend ipc --shape 4096,4096 \
      --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 -n 1000000 -w 1 -c 0
  fi
else
  note "GPU tests" "NOT RUN (build failed)"
fi

echo
echo "=== summary ($(( $(date +%s) - START ))s)"
printf '%s\n' "${SUMMARY[@]}"
printf '%s\n' "${SUMMARY[@]}" | grep -q FAIL && exit 1
exit 0
