#!/usr/bin/env bash
# reshard and its baselines in a SimGrid SMPI simulation: the real MPI
# executor (rounds, relays, phases, pacing) on simulated hosts with
# flow-level network models, beside gather + MPI_Bcast and MPI_Alltoallw
# in the same simulation (issue 20).
#
#   scripts/simulate.sh [--smoke] [build-dir]     (default: build-sim)
#
# --smoke: one 8-rank case, every element checked (CI: seconds). Without
# it: the flat-cluster cases below. Needs SimGrid (Debian:
# apt-get install libsimgrid-dev).
#
# Platform: a flat cluster, one host per rank, each with one 50 GB/s link
# (a GPU's NIC share) into a non-blocking backbone, 1 us latency. Not
# simulated: NVLink domains (the presets' platforms are still to come),
# the pack and unpack work (host computation is not charged,
# smpi/simulate-computation:no), NCCL's protocol.
#
# SMPI settings, and why:
#   smpi/privatization:yes        every rank its own globals (reshard and
#                                 the tool keep per-process state)
#   smpi/simulate-computation:no  no simulated time for host computation:
#                                 only the network is measured
#   smpi/test:0, smpi/iprobe:0    reshard polls MPI_Test in loops; SMPI
#                                 would otherwise charge each call
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1
  shift
fi
BUILD=${1:-build-sim}
command -v smpicc >/dev/null && command -v smpirun >/dev/null || {
  echo "simulate.sh: SimGrid's smpicc/smpirun not found (Debian: apt-get install libsimgrid-dev)" >&2
  exit 2
}

mkdir -p "$BUILD"
CC=smpicc cmake -S . -B "$BUILD" -DRESHARD_SIMGRID=ON -DMPI_C_COMPILER=smpicc -DCMAKE_BUILD_TYPE=Release \
  >"$BUILD/simulate-configure.log" 2>&1 || { cat "$BUILD/simulate-configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target reshard_perf >"$BUILD/simulate-build.log" 2>&1 ||
  { tail -n 30 "$BUILD/simulate-build.log"; exit 1; }
PERF="$(cd "$BUILD" && pwd)/tools/reshard_perf"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
hosts=64
cat >"$work/flat.xml" <<XML
<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <cluster id="flat" prefix="h" suffix="" radical="0-$((hosts - 1))" speed="1Gf" bw="50GBps" lat="1us"
           bb_bw="100TBps" bb_lat="0us"/>
</platform>
XML
for i in $(seq 0 $((hosts - 1))); do echo "h$i"; done >"$work/hosts"

# run NP ARGS...: one simulated reshard_perf; its table and final lines
run() {
  local np=$1
  shift
  echo "=== $np simulated ranks: reshard_perf $*"
  smpirun -np "$np" -platform "$work/flat.xml" -hostfile "$work/hosts" \
    --cfg=smpi/privatization:yes --cfg=smpi/simulate-computation:no --cfg=smpi/test:0 --cfg=smpi/iprobe:0 \
    --log=root.threshold:warning "$PERF" "$@" >"$work/out" 2>&1 || { cat "$work/out"; return 1; }
  grep -v '^\[' "$work/out" | grep -E '^#  |^ +[a-z]|^# (reshard_perf|baseline)'
  grep -q '^# reshard_perf: .* wrong=0$' "$work/out" || { echo "simulate.sh: wrong elements" >&2; return 1; }
}

if [ "$smoke" = 1 ]; then
  run 8 --shape 1024,1024 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 \
    -n 3 -w 1 -c 1 --baseline broadcast,alltoallw
  exit 0
fi
# The flat-cluster cases of issue 20: replicated destinations, replicated
# sources (replica balancing), and a 1 -> 16 fan-out, direct and relayed.
run 8 --shape 4096,4096 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 \
  -n 5 -w 1 -c 1 --baseline broadcast,alltoallw
run 8 --shape 4096,4096 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1 \
  -n 5 -w 1 -c 1 --baseline broadcast,alltoallw
for relay in 0 1; do
  RESHARD_RELAY=$relay run 17 --shape 4096,4096 --src-mesh 1 --src-placements R --dst-mesh 16 --dst-placements R \
    -n 3 -w 1 -c 1 --baseline broadcast
done
