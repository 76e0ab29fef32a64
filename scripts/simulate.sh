#!/usr/bin/env bash
# reshard and its baselines in a SimGrid SMPI simulation: the real MPI
# executor (rounds, relays, phases, pacing) on simulated hosts with
# flow-level network models, beside gather + MPI_Bcast and MPI_Alltoallw
# in the same simulation (issue 20).
#
#   scripts/simulate.sh [--smoke | --panel | --replay | --replay-full] [build-dir]
#                                                            (default: build-sim)
#
# --smoke: one 8-rank case, every element checked, and the same folded
# (CI: seconds). --panel: the cost model's five panel scenarios at their
# rank counts with a few layers (folded), and DeepSeek-V3 and Kimi-K2 on
# fewer ranks, a markdown table on stdout; SIM_PANEL_ONLY=REGEX picks
# scenarios by name (the 256- and 384-rank ones take long: SimGrid's
# bookkeeping grows with the messages in flight); SIM_BASELINES= (empty)
# runs reshard without the baselines. Without either: the flat-cluster cases and
# the presets' small cases below. Needs SimGrid (Debian: apt-get install
# libsimgrid-dev).
#
# --replay, --replay-full (issue 44): the plan replay. reshard_plan
# --replay-out writes every rank's schedule (its messages, rounds,
# forwards, agreement partners) and tools/reshard_replay walks it with
# the executor's own schedule code (rs_sched_run), one SimGrid actor per
# rank, on the same preset platform and network settings as the SMPI
# runs; only the network is simulated, as here. --replay: the reduced
# panel scenarios (the --panel list, SIM_PANEL_ONLY applies) under SMPI
# and replayed, a table of both simulated times, their ratio and the wall
# times: the replay's validation. --replay-full: scripts/panel.sh's
# scenarios at full size (every layer, their rank counts), replayed,
# beside the cost model's prediction and T_lower. Both use reshard_plan
# and reshard_replay from REPLAY_BUILD (default build; CMake builds
# reshard_replay where it finds SimGrid's C library);
# REPLAY_WALL_LIMIT (default 3600 s: the longest panel replays take 24
# and 27 min on the 2-core VM) ends a replay that runs longer;
# REPLAY_MSG_US (--replay, --replay-full): each data message occupies its
# route that many microseconds longer (reshard_replay --msg-us; the cost
# model charges 1 us a network message, the fluid network nothing).
# SIM_REPLAY_ONLY=1 (--replay) skips SMPI, for the scenarios it cannot
# finish (their SMPI columns then say nan).
#
# Platforms: a flat cluster, one host per rank, each with one 50 GB/s link
# (a GPU's NIC share) into a non-blocking backbone, 1 us latency; and the
# topology presets' machines (preset_platform below: NVLink domains, one
# NIC share per GPU). Not simulated: the pack and unpack work (host
# computation is not charged, smpi/simulate-computation:no), NCCL's
# protocol, NVLink switch contention beyond each port.
#
# SMPI settings, and why:
#   smpi/privatization:yes        every rank its own globals (reshard and
#                                 the tool keep per-process state)
#   smpi/simulate-computation:no  no simulated time for host computation:
#                                 only the network is measured (so plan
#                                 creation's real cost is printed apart:
#                                 reshard_perf's "# plan (real CPU" line)
#   smpi/test:0, smpi/iprobe:0    reshard polls MPI_Test in loops; SMPI
#                                 would otherwise charge each call (in
#                                 simulation builds a waiting rank naps
#                                 1 us of simulated time between polls)
#   smpi/bw-factor:0:1,           each message gets its links' bandwidth
#   smpi/lat-factor:0:1           and latency (SIM_NET=fluid, the
#                                 default). SMPI's own factors (SIM_NET=
#                                 smpi) were calibrated on a TCP Gigabit
#                                 Ethernet cluster: 0.94 of the bandwidth
#                                 and 11.6 x the latency for messages over
#                                 64 KiB, which models TCP, not the RDMA
#                                 NICs and NVLink the presets describe
#                                 (their latency is per message already).
#                                 docs/PERFORMANCE.md has both for the
#                                 flat cases.
#   smpi/shared-malloc-blocksize  folded runs (RESHARD_SIM_FOLD=1): 256 MiB
#                                 blocks, so that a panel run's hundreds of
#                                 GB of folded buffers stay under the
#                                 kernel's 65530 mappings (1 MiB blocks
#                                 did not)
# And RESHARD_MPI_DATATYPES=0: reshard packs into staging as it does on
# GPUs (the simulated time is the same; SMPI copies data sent through
# derived datatypes through fresh buffers, hours at panel size).
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=0 panel=0 replay=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1
  shift
elif [ "${1:-}" = "--panel" ]; then
  panel=1
  shift
elif [ "${1:-}" = "--replay" ]; then
  replay=1
  shift
elif [ "${1:-}" = "--replay-full" ]; then
  replay=2
  shift
fi
case ${SIM_NET:-fluid} in
  fluid) net=(--cfg=smpi/bw-factor:0:1 --cfg=smpi/lat-factor:0:1) ;;
  smpi) net=() ;;
  *) echo "simulate.sh: SIM_NET is fluid or smpi, not '$SIM_NET'" >&2; exit 2 ;;
esac
export RESHARD_MPI_DATATYPES=0
BUILD=${1:-build-sim}
command -v smpicc >/dev/null && command -v smpirun >/dev/null || {
  echo "simulate.sh: SimGrid's smpicc/smpirun not found (Debian: apt-get install libsimgrid-dev)" >&2
  exit 2
}

# --replay, --replay-full: reshard_plan and reshard_replay from a plain
# build (REPLAY_BUILD, default build), which CMake gives reshard_replay
# where it finds SimGrid's C library
if [ "$replay" != 0 ]; then
  RBUILD=${REPLAY_BUILD:-build}
  mkdir -p "$RBUILD"
  cmake -S . -B "$RBUILD" >"$RBUILD/replay-configure.log" 2>&1 &&
    cmake --build "$RBUILD" -j"$(nproc)" --target reshard_plan reshard_replay >"$RBUILD/replay-build.log" 2>&1 ||
    { tail -n 30 "$RBUILD/replay-configure.log" "$RBUILD/replay-build.log"; exit 1; }
  PLAN="$(cd "$RBUILD" && pwd)/tools/reshard_plan"
  REPLAY="$(cd "$RBUILD" && pwd)/tools/reshard_replay"
  [ -x "$REPLAY" ] || { echo "simulate.sh: $REPLAY not built (SimGrid's C library not found by CMake)" >&2; exit 2; }
fi
if [ "$replay" != 2 ] && { [ "$replay" = 0 ] || [ "${SIM_REPLAY_ONLY:-0}" != 1 ]; }; then # (--replay-full runs no SMPI)
  mkdir -p "$BUILD"
  CC=smpicc cmake -S . -B "$BUILD" -DRESHARD_SIMGRID=ON -DMPI_C_COMPILER=smpicc -DCMAKE_BUILD_TYPE=Release \
    >"$BUILD/simulate-configure.log" 2>&1 || { cat "$BUILD/simulate-configure.log"; exit 1; }
  cmake --build "$BUILD" -j"$(nproc)" --target reshard_perf >"$BUILD/simulate-build.log" 2>&1 ||
    { tail -n 30 "$BUILD/simulate-build.log"; exit 1; }
  PERF="$(cd "$BUILD" && pwd)/tools/reshard_perf"
fi

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

# preset_platform PRESET NRANKS NSRC > file: the machine of a topology
# preset (src/plan/topology.c) as SimGrid sees it. Every rank (GPU) has an
# NVLink port (the preset's NVLink bandwidth per direction) and its share
# of its node's NICs (per direction); ranks of one NVLink domain reach
# each other port to port, other ranks NIC to NIC through a non-blocking
# backbone (left out of the routes: a 100 TB/s fat pipe with no latency
# never limits a flow, and in SimGrid's max-min solver one constraint
# shared by every cross-domain flow made each rate update walk all of
# them: a 64-rank replay took 12 s with it, 1 s without, simulated times
# equal to the nanosecond). Latency as the cost model takes it once a round: 2 x 1 us
# inside a domain, 2 x 2.5 us across (SimGrid charges it to every message,
# in flight together; the model's cost of each message, its posting, is
# not simulated). Ranks sit where the cost model puts
# them (src/plan/topology.h): the first NSRC ranks (the source side) fill
# domains from the first, the rest start on a fresh one.
preset_platform() {
  local preset=$1 n=$2 nsrc=$3 used nv nic
  case $preset in
    h100-8x400g) used=8 nv=450 nic=50 ;;  # 8 GPUs, 8 x 400 Gb/s NICs a node
    gb200-nvl72) used=64 nv=900 nic=50 ;; # 64 of a 72-GPU domain used, 4 NICs per 4-GPU tray
    *) echo "simulate.sh: no platform for preset $preset" >&2; return 1 ;;
  esac
  awk -v n="$n" -v nsrc="$nsrc" -v used="$used" -v nv="$nv" -v nic="$nic" 'BEGIN {
    first = int((nsrc + used - 1) / used)
    for (r = 0; r < n; r++) dom[r] = r < nsrc ? int(r / used) : first + int((r - nsrc) / used)
    print "<?xml version=\x27" "1.0\x27?>"
    print "<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">"
    print "<platform version=\"4.1\">"
    print "  <zone id=\"machine\" routing=\"Full\">"
    for (r = 0; r < n; r++) {
      printf "    <host id=\"h%d\" speed=\"1Gf\"/>\n", r
      printf "    <link id=\"nv%d\" bandwidth=\"%dGBps\" latency=\"1us\" sharing_policy=\"SPLITDUPLEX\"/>\n", r, nv
      printf "    <link id=\"nic%d\" bandwidth=\"%dGBps\" latency=\"2.5us\" sharing_policy=\"SPLITDUPLEX\"/>\n", r, nic
    }
    for (a = 0; a < n; a++)
      for (b = 0; b < n; b++) {
        if (a == b) continue
        printf "    <route src=\"h%d\" dst=\"h%d\" symmetrical=\"NO\">", a, b
        if (dom[a] == dom[b])
          printf "<link_ctn id=\"nv%d\" direction=\"UP\"/><link_ctn id=\"nv%d\" direction=\"DOWN\"/>", a, b
        else
          printf "<link_ctn id=\"nic%d\" direction=\"UP\"/><link_ctn id=\"nic%d\" direction=\"DOWN\"/>", a, b
        print "</route>"
      }
    print "  </zone>"
    print "</platform>"
  }'
}

# run NP ARGS...: one simulated reshard_perf on the flat cluster (PLATFORM
# in the environment: another platform file); its table and final lines
run() {
  local np=$1 rc=0
  shift
  echo "=== $np simulated ranks${PLATFORM:+ on $(basename "$PLATFORM" .xml)}: reshard_perf $*"
  local hosts="$work/hosts"
  if [ -n "${PLATFORM:-}" ]; then
    hosts="$work/hosts.$np"
    for i in $(seq 0 $((np - 1))); do echo "h$i"; done >"$hosts"
  fi
  smpirun -np "$np" -platform "${PLATFORM:-$work/flat.xml}" -hostfile "$hosts" \
    --cfg=smpi/privatization:yes --cfg=smpi/simulate-computation:no --cfg=smpi/test:0 --cfg=smpi/iprobe:0 "${net[@]}" \
    ${RESHARD_SIM_FOLD:+--cfg=smpi/shared-malloc-blocksize:268435456} \
    --log=root.threshold:warning "$PERF" "$@" >"$work/out" 2>&1 || rc=$?
  grep -v '^\[' "$work/out" | grep -E '^#  |^ +[a-z]|^# (reshard_perf|baseline|cost model|plan)' || cat "$work/out"
  grep -q '^# reshard_perf: .* wrong=0$' "$work/out" || { echo "simulate.sh: reshard moved wrong elements" >&2; return 1; }
  if [ "${rc:-0}" -ne 0 ]; then
    # reshard was exact; a baseline was not (its #wrong column)
    echo "simulate.sh: reshard_perf exited ${rc} (a baseline's elements were wrong)"
    [ "$smoke" = 0 ] || return 1
  fi
  return 0
}

if [ "$smoke" = 1 ]; then
  run 8 --shape 1024,1024 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 \
    -n 3 -w 1 -c 1 --baseline broadcast,alltoallw
  # the folded path (below) must not rot either
  RESHARD_SIM_FOLD=1 run 8 --shape 1024,1024 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 \
    --dst-placements R,S1 -n 3 -w 1 -c 0 --baseline broadcast,alltoallw
  exit 0
fi
# The panel's scenarios reduced to what SMPI runs in minutes to an hour
# (--panel, and --replay's validation).
# name | preset | source ranks | destination ranks | reshard_perf model args
scenarios=(
  "DeepSeek-V3 671B, 7 of 61 layers (stages 4+1+1+1)|gb200-nvl72|128|128|--model-config configs/DeepSeek-V3.json --layers 7 --train tp=1,pp=4,dp=32,ep=16,first=4 --infer tp=8,dp=16"
  "Qwen3-235B-A22B, 4 of 94 layers|gb200-nvl72|64|64|--model-config configs/Qwen3-235B-A22B.json --layers 4 --train tp=2,pp=4,dp=8,ep=16,etp=1 --infer tp=8,dp=8"
  "Kimi-K2 1T, 8 of 61 layers|h100-8x400g|256|128|--model-config configs/Kimi-K2-Instruct.json --layers 8 --train tp=2,pp=8,dp=16,ep=32,etp=1 --infer tp=8,dp=16,ep=128"
  "Llama-3.1-70B, 4 of 80 layers|h100-8x400g|32|64|--model-config configs/Llama-3.1-70B.json --layers 4 --train tp=8,pp=4 --infer tp=8,dp=8"
  "Qwen3-30B-A3B, 2 of 48 layers|h100-8x400g|32|32|--model-config configs/Qwen3-30B-A3B.json --layers 2 --train tp=1,pp=2,dp=16,ep=16 --infer tp=4,dp=8,ep=32"
  # the 256- and 384-rank scenarios did not finish in 50 min on this VM:
  # the same models on fewer ranks (changed scenarios, said as such)
  "DeepSeek-V3 671B on 32 + 32 ranks (not the panel's 128 + 128), 4 of 61 layers|gb200-nvl72|32|32|--model-config configs/DeepSeek-V3.json --layers 4 --train tp=1,pp=4,dp=8,ep=8 --infer tp=8,dp=4"
  "Kimi-K2 1T on 64 + 32 ranks (not the panel's 256 + 128), 4 of 61 layers|h100-8x400g|64|32|--model-config configs/Kimi-K2-Instruct.json --layers 4 --train tp=2,pp=4,dp=8,ep=16,etp=1 --infer tp=8,dp=4,ep=32"
  # experts without replicas on the last stage, bf16 training to fp8
  # serving: source-side spreading of the codes (src/plan/spread.h)
  "DeepSeek-V3 671B bf16 -> fp8 on 32 + 32 ranks, 4 of 61 layers|gb200-nvl72|32|32|--model-config configs/DeepSeek-V3.json --layers 4 --train tp=1,pp=4,dp=8,ep=8 --infer tp=8,dp=4,ep=32 --infer-dtype fp8e4m3"
  # the panel's fp8 rows at their rank counts, reduced like the first and
  # third rows (SMPI cannot finish them: replay them, SIM_REPLAY_ONLY=1)
  "DeepSeek-V3 671B bf16 -> fp8 blocks, 7 of 61 layers (stages 4+1+1+1)|gb200-nvl72|128|128|--model-config configs/DeepSeek-V3.json --layers 7 --train tp=1,pp=4,dp=32,ep=16,first=4 --infer tp=8,dp=16,ep=128 --infer-dtype fp8e4m3"
  "Kimi-K2 1T bf16 -> fp8 blocks, 8 of 61 layers|h100-8x400g|256|128|--model-config configs/Kimi-K2-Instruct.json --layers 8 --train tp=2,pp=8,dp=16,ep=32,etp=1 --infer tp=8,dp=16,ep=128 --infer-dtype fp8e4m3"
  # the panel's M2N and SGLang rows (scripts/panel.sh), reduced alike
  "DeepSeek-V3 671B, M2N's configuration, 9 of 61 layers (stages 2+1+1+1+1+1+1+1)|h100-8x400g|128|128|--model-config configs/DeepSeek-V3.json --layers 9 --train tp=1,pp=8,dp=16,ep=16,first=2 --infer tp=16,dp=8"
  "Qwen3-235B-A22B, M2N's configuration (CP2), 4 of 94 layers|gb200-nvl72|64|64|--model-config configs/Qwen3-235B-A22B.json --layers 4 --train tp=2,cp=2,pp=4,dp=4,ep=16,etp=1 --infer tp=8,dp=8"
  "DeepSeek-V3 671B -> SGLang DP attention, 7 of 61 layers (stages 4+1+1+1)|h100-8x400g|128|16|--model-config configs/DeepSeek-V3.json --layers 7 --train tp=1,pp=4,dp=32,ep=16,first=4 --infer sglang:tp=16,attn_dp=16,ep=16"
  "Qwen3-235B-A22B -> SGLang EP8 x 8 engines, 4 of 94 layers|gb200-nvl72|64|64|--model-config configs/Qwen3-235B-A22B.json --layers 4 --train tp=2,pp=4,dp=8,ep=16,etp=1 --infer sglang:tp=8,dp=8,ep=8"
)
f() { sed -nE "s/.*$1=([^ ;]+).*/\1/p" "$2" | head -n 1; }
# The replay's network settings: SMPI's own network model with the same
# factors as the SMPI runs (SIM_NET), so that both simulate one network.
case ${SIM_NET:-fluid} in
  fluid) replay_net=(--cfg=network/model:SMPI --cfg=smpi/bw-factor:0:1 --cfg=smpi/lat-factor:0:1) ;;
  smpi) replay_net=(--cfg=network/model:SMPI) ;;
esac
# and smpirun's own precision (it passes surf/precision:1e-9)
replay_net+=(--cfg=surf/precision:1e-9)
# replay_one PLAN_ARGS... : plans every rank in one process with
# --replay-out (the cost model's pick, relay -1), writes the preset's
# platform for its world and replays it; leaves the plan's output in
# $work/plan.txt and the replay's in $work/replay.txt, their wall seconds
# in plan_wall and replay_wall. PRESET in the environment.
replay_one() {
  local start=$SECONDS
  "$PLAN" "$@" --topology "$PRESET" --no-check --replay-out "$work/sched" >"$work/plan.txt" 2>&1 ||
    { tail -n 20 "$work/plan.txt"; return 1; }
  plan_wall=$((SECONDS - start))
  local nsrc ndst
  read -r nsrc ndst < <(sed -nE 's/^# world [0-9]+ \(([0-9]+) source, ([0-9]+) destination.*/\1 \2/p' "$work/plan.txt")
  preset_platform "$PRESET" "$((nsrc + ndst))" "$nsrc" >"$work/replay.xml"
  start=$SECONDS
  "$REPLAY" "$work/sched" "$work/replay.xml" --wall-limit "${REPLAY_WALL_LIMIT:-3600}" --progress "${replay_net[@]}" \
    ${REPLAY_MSG_US:+--msg-us "$REPLAY_MSG_US"} \
    --log=root.threshold:warning >"$work/replay.txt" 2>&1 || { tail -n 20 "$work/replay.txt"; rm -f "$work/sched"; return 1; }
  replay_wall=$((SECONDS - start))
  rm -f "$work/sched"
}
# a figure of the replay's result line (its --progress lines come before)
rv() { sed -nE "s/^# replay: .*$1=([^ ;]+).*/\1/p" "$work/replay.txt"; }
# the pre-plans a call runs first, replayed as stages before the main
# plan (fp8 quantization's gathering, source-side spreading's)
replay_note() {
  if grep -q '^# fp8 gathering: ' "$work/plan.txt"; then echo " (fp8 gathering pre-plan replayed)"; fi
}
if [ "$replay" = 1 ]; then
  # Validation: the reduced panel scenarios (the --panel list), each as
  # the real MPI executor under SMPI (reshard alone, folded, -c 0) and as
  # the replay of the same plan on the same platform. Logs in $PANEL_LOGS
  # (default /tmp/reshard_sim_replay).
  logs=${PANEL_LOGS:-/tmp/reshard_sim_replay}
  mkdir -p "$logs"
  rows=()
  for sc in "${scenarios[@]}"; do
    IFS='|' read -r name preset nsrc ndst args <<<"$sc"
    if [ -n "${SIM_PANEL_ONLY:-}" ] && ! grep -qE "$SIM_PANEL_ONLY" <<<"$name"; then continue; fi
    n=$((nsrc + ndst))
    tag=$(echo "$name" | tr -c 'A-Za-z0-9.\n-' '_' | cut -c1-24)
    preset_platform "$preset" "$n" "$nsrc" >"$work/panel.xml"
    start=$SECONDS
    t=nan
    if [ "${SIM_REPLAY_ONLY:-0}" != 1 ]; then
      # shellcheck disable=SC2086
      RESHARD_SIM_FOLD=1 PLATFORM="$work/panel.xml" run "$n" $args --topology "$preset" -n 1 -w 1 -c 0 \
        >"$logs/$tag.smpi.txt" 2>&1 || { cat "$logs/$tag.smpi.txt"; exit 1; }
      cp "$work/out" "$logs/$tag.smpi.out"
      t=$(f time_us "$work/out")
    fi
    smpi_wall=$((SECONDS - start))
    # shellcheck disable=SC2086
    PRESET=$preset replay_one $args || exit 1
    cp "$work/plan.txt" "$logs/$tag.plan.txt"
    cp "$work/replay.txt" "$logs/$tag.replay.txt"
    r=$(rv simulated_s)
    m=$(rv messages)
    echo "simulate.sh: $name: SMPI $smpi_wall s, plan $plan_wall s + replay $replay_wall s" >&2
    rows+=("$(awk -v name="$name$(replay_note)" -v preset="$preset" -v ranks="$nsrc + $ndst" -v t="$t" -v r="$r" \
      -v m="$m" -v sw="$smpi_wall" -v pw="$plan_wall" -v rw="$replay_wall" 'BEGIN {
      printf "| %s | %s | %s | %s | %.0f | %.0f | %.3f | %d | %d + %d |", name, preset, ranks, m, t, r * 1e6, r * 1e6 / t,
        sw, pw, rw }')")
  done
  echo "| scenario (scaled) | machine | ranks | messages | SMPI us (real executor) | replay us | replay / SMPI | SMPI wall s | plan + replay wall s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  exit 0
fi
if [ "$replay" = 2 ]; then
  # Full size: scripts/panel.sh's scenarios at their rank counts, every
  # layer, planned (--replay-out) and replayed, beside the cost model's
  # prediction and T_lower from the same reshard_plan run. The scenario
  # list is panel.sh's own (read from it, not copied).
  eval "$(sed -n '/^scenarios=(/,/^)/p' scripts/panel.sh)"
  logs=${PANEL_LOGS:-/tmp/reshard_sim_replay_full}
  mkdir -p "$logs"
  rows=()
  for sc in "${scenarios[@]}"; do
    IFS='|' read -r name cfg train infer topo _pub pargs <<<"$sc"
    if [ -n "${SIM_PANEL_ONLY:-}" ] && ! grep -qE "$SIM_PANEL_ONLY" <<<"$name"; then continue; fi
    tag=$(echo "$name" | tr -c 'A-Za-z0-9.\n-' '_' | cut -c1-24)
    # shellcheck disable=SC2086
    if ! PRESET=$topo replay_one --model-config "configs/$cfg" --train "$train" --infer "$infer" ${pargs:-}; then
      # (a replay past REPLAY_WALL_LIMIT: said in the table, the next scenario runs)
      cp "$work/plan.txt" "$logs/$tag.plan.txt"
      cp "$work/replay.txt" "$logs/$tag.replay.txt" 2>/dev/null || true
      echo "simulate.sh: $name: failed, see $logs/$tag.*.txt" >&2
      rows+=("| $name | $topo | | | failed or past the wall limit (${REPLAY_WALL_LIMIT:-3600} s) | | | |")
      continue
    fi
    cp "$work/plan.txt" "$logs/$tag.plan.txt"
    cp "$work/replay.txt" "$logs/$tag.replay.txt"
    res=$(grep '^# reshard_plan: predicted_s=' "$work/plan.txt")
    p=$(sed -nE 's/.*predicted_s=([^ ]+).*/\1/p' <<<"$res")
    l=$(sed -nE 's/.*lower_s=([^ ]+).*/\1/p' <<<"$res")
    r=$(rv simulated_s)
    m=$(rv messages)
    ranks=$(sed -nE 's/^# world [0-9]+ \(([0-9]+) source, ([0-9]+) destination.*/\1 + \2/p' "$work/plan.txt")
    echo "simulate.sh: $name: plan $plan_wall s + replay $replay_wall s" >&2
    rows+=("$(awk -v name="$name$(replay_note)" -v topo="$topo" -v ranks="$ranks" -v m="$m" -v r="$r" -v p="$p" \
      -v l="$l" -v pw="$plan_wall" -v rw="$replay_wall" 'BEGIN {
      printf "| %s | %s | %s | %s | %.4g | %.4g (%.3f) | %.4g (%.3f) | %d + %d |", name, topo, ranks, m, r, p, r / p, l,
        r / l, pw, rw }')")
  done
  echo "| scenario (all layers) | machine | ranks | messages | replay s | predicted s (replay / predicted) | T_lower s (replay / T_lower) | plan + replay wall s |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  exit 0
fi
if [ "$panel" = 1 ]; then
  # The cost model's panel (scripts/panel.sh) at its rank counts, with the
  # first few layers (real shapes; pipeline stages re-split, noted), every
  # rank's data folded (nothing checked: -c 0). Per scenario two
  # simulations: the plan the cost model picks (relay -1) beside gather +
  # MPI_Bcast and alltoallw, then the direct plan (RESHARD_RELAY=0). Full
  # logs in $PANEL_LOGS (default /tmp/reshard_sim_panel).
  logs=${PANEL_LOGS:-/tmp/reshard_sim_panel}
  mkdir -p "$logs"
  rows=()
  for sc in "${scenarios[@]}"; do
    IFS='|' read -r name preset nsrc ndst args <<<"$sc"
    # SIM_PANEL_ONLY: an extended regular expression of the scenarios to run
    if [ -n "${SIM_PANEL_ONLY:-}" ] && ! grep -qE "$SIM_PANEL_ONLY" <<<"$name"; then continue; fi
    n=$((nsrc + ndst))
    tag=$(echo "$name" | tr -c 'A-Za-z0-9.\n-' '_' | cut -c1-24)
    preset_platform "$preset" "$n" "$nsrc" >"$work/panel.xml"
    start=$SECONDS
    # shellcheck disable=SC2086
    RESHARD_SIM_FOLD=1 PLATFORM="$work/panel.xml" run "$n" $args --topology "$preset" -n 1 -w 1 -c 0 \
      ${SIM_BASELINES-"--baseline broadcast,alltoallw"} >"$logs/$tag.auto.txt" 2>&1 || { cat "$logs/$tag.auto.txt"; exit 1; }
    cp "$work/out" "$logs/$tag.auto.out"
    # shellcheck disable=SC2086
    RESHARD_RELAY=0 RESHARD_SIM_FOLD=1 PLATFORM="$work/panel.xml" run "$n" $args --topology "$preset" -n 1 -w 1 -c 0 \
      >"$logs/$tag.direct.txt" 2>&1 || { cat "$logs/$tag.direct.txt"; exit 1; }
    cp "$work/out" "$logs/$tag.direct.out"
    echo "simulate.sh: $name: $((SECONDS - start)) s" >&2
    a=$logs/$tag.auto.out
    t=$(f time_us "$a")
    p=$(f predicted_us "$a")
    l=$(f T_lower_us "$a")
    d=$(f time_us "$logs/$tag.direct.out")
    b=$(sed -nE 's/^# baseline broadcast: time_us=([^ ]+).*/\1/p' "$a")
    w=$(sed -nE 's/^# baseline alltoallw: time_us=([^ ]+).*/\1/p' "$a")
    gb=$(awk -v x="$(f bytes "$a")" 'BEGIN { printf "%.1f", x / 1e9 }')
    rows+=("$(awk -v name="$name" -v preset="$preset" -v ranks="$nsrc + $ndst" -v gb="$gb" -v t="$t" -v p="$p" \
      -v l="$l" -v d="$d" -v b="$b" -v w="$w" 'BEGIN {
      printf "| %s | %s | %s | %s | %.0f | %.0f (%.2f) | %.0f (%.2f) | %.0f (%.2f) | %.0f (%.1f x) | %.0f (%.2f x) |",
        name, preset, ranks, gb, t, p, t / p, l, t / l, d, d / l, b, b / t, w, w / t }')")
  done
  echo "| scenario (scaled) | machine | ranks | GB delivered | reshard us (cost model's pick) | predicted us (simulated / predicted) | T_lower us (simulated / T_lower) | direct plan us (/ T_lower) | gather + MPI_Bcast us (/ reshard) | alltoallw us (/ reshard) |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
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
# Panel size on this 2-core machine (issue 20, item 2): the whole
# Qwen2.5-0.5B (24 layers, 7.5 GiB between ranks) on 32 simulated ranks,
# every rank's buffers and staging folded onto the same pages
# (RESHARD_SIM_FOLD=1: SMPI_SHARED_MALLOC), so nothing is checked (-c 0;
# the checks are proven on real runs and on the smaller cases above).
RESHARD_SIM_FOLD=1 run 32 --model-config configs/Qwen2.5-0.5B.json --train tp=2,pp=2,dp=4 --infer tp=2,dp=8 \
  -n 3 -w 1 -c 0
# The presets' machines, a model's weights: the plan the cost model picks
# (relay -1), its prediction and T_lower beside the simulated time.
for preset in h100-8x400g gb200-nvl72; do
  preset_platform "$preset" 16 8 >"$work/$preset.xml"
  PLATFORM="$work/$preset.xml" run 16 --model-config configs/Qwen2.5-0.5B.json --layers 4 \
    --train tp=2,pp=2,dp=2 --infer tp=2,dp=4 --topology "$preset" -n 3 -w 1 -c 1 --baseline broadcast,alltoallw
done
