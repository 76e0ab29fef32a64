#!/usr/bin/env bash
# The cost model against measured reshard_perf times on this machine (the
# cpu preset: MPI ranks copying through one host's memory).
#
#   scripts/validate_cost.sh [BUILD_DIR] [calibrate|validate|both]
#
# calibrate: three microbenchmarks, none of them a validation case, give
#   the cpu preset's constants (src/plan/topology.c):
#     per-rank copy bandwidth  1 source -> 1 destination rank, one 64 MiB
#                              message (np 2): bytes / time
#     node copy bandwidth      4 pairs at once, 16 MiB each (np 8):
#                              64 MiB / time
#     per-message cost         1 -> 1 rank, one 64-byte message (np 2)
#   each the median of REPEAT runs (default 3) of reshard_perf's median.
# validate: reshard_perf --topology cpu on several layouts (2 to 8 ranks,
#   one model), printing measured and predicted times and the error
#   (predicted - measured) / measured as a markdown table.
# The machine is shared and small (2 cores): timings vary by 20% or more
# between runs; the table says so rather than hiding it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build}
what=${2:-both}
perf=$build/tools/reshard_perf
repeat=${REPEAT:-3}
[[ -x $perf ]] || { echo "validate_cost.sh: $perf not built (cmake --build $build --target reshard_perf)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

out=$(mktemp)
trap 'rm -f "$out" "$out.model"' EXIT

# run NP ARGS...: one reshard_perf run; sets measured_us, predicted_us, bound
run() {
  local np=$1
  shift
  mpirun -np "$np" --oversubscribe "$perf" "$@" --topology cpu >"$out" 2>&1 || {
    echo "validate_cost.sh: reshard_perf failed:" "$@" >&2
    tail -n 20 "$out" >&2
    exit 1
  }
  measured_us=$(sed -nE 's/^# reshard_perf: .*time_us=([0-9.]+).*/\1/p' "$out")
  predicted_us=$(sed -nE 's/^# cost model \(cpu\): predicted_us=([0-9.]+).*/\1/p' "$out")
  bound=$(sed -nE 's/^# cost model \(cpu\): .* bound by ([a-z-]+) at.*/\1/p' "$out")
  echo "$predicted_us $bound" >"$out.model" # timed runs in a subshell
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# timed NP ARGS...: the median of $repeat runs' measured time
timed() {
  local i
  for ((i = 0; i < repeat; i++)); do
    run "$@"
    echo "$measured_us"
  done | median
}

if [[ $what == calibrate || $what == both ]]; then
  big=$(timed 2 --shape 16777216 --src-mesh 1 --src-placements S0 --dst-mesh 1 --dst-placements S0 -n 20 -w 3)
  node=$(timed 8 --shape 16777216 --src-mesh 4 --src-placements S0 --dst-mesh 4 --dst-placements S0 -n 20 -w 3)
  tiny=$(timed 2 --shape 16 --src-mesh 1 --src-placements S0 --dst-mesh 1 --dst-placements S0 -n 200 -w 10)
  awk -v big="$big" -v node="$node" -v tiny="$tiny" 'BEGIN {
    printf "calibration (median of medians): 64 MiB 1->1: %.1f us; 4 x 16 MiB at once: %.1f us; 64 B 1->1: %.1f us\n", big, node, tiny
    printf "cpu preset: nvlink_bw (per-rank copy) = %.3g B/s, node_copy_bw = %.3g B/s, per-message cost (net_msg_s, nvlink_msg_s) = %.2g s\n",
           67108864 / (big * 1e-6), 67108864 / (node * 1e-6), tiny * 1e-6
  }'
fi

if [[ $what == validate || $what == both ]]; then
  cases=(
    "2|--shape 2048,2048 --src-mesh 1 --src-placements S0 --dst-mesh 1 --dst-placements S1"
    "3|--shape 2048,2048 --src-mesh 1 --src-placements R --dst-mesh 2 --dst-placements R --staging 4M"
    "4|--shape 4096,4096 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1"
    "4|--shape 4096,2048 --src-mesh 2,2 --src-placements S1,S0 --dst-mesh 4 --dst-placements S1 --colocate"
    "6|--shape 4096,2048 --src-mesh 2 --src-placements R --dst-mesh 4 --dst-placements S0"
    "8|--shape 4096,4096 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1"
    "8|--shape 4096,4096 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1"
    "8|--model-config $repo/configs/Qwen2.5-0.5B.json --layers 4 --train tp=2,pp=2 --infer tp=2,dp=2"
  )
  echo "| ranks | case | measured ms (median of $repeat) | predicted ms | error | model's bound |"
  echo "|---|---|---|---|---|---|"
  for c in "${cases[@]}"; do
    IFS='|' read -r np args <<<"$c"
    # shellcheck disable=SC2086
    m=$(timed "$np" $args -n 20 -w 3)
    read -r predicted_us bound <"$out.model"
    shown=${args//$repo\//}
    awk -v np="$np" -v a="$shown" -v m="$m" -v p="$predicted_us" -v b="$bound" 'BEGIN {
      printf "| %d | `%s` | %.2f | %.2f | %+.0f%% | %s |\n", np, a, m / 1000, p / 1000, (p - m) / m * 100, b
    }'
  done
fi
