#!/usr/bin/env bash
# tools_replay: reshard_plan --replay-out and reshard_replay on an 8-rank
# case (one 64 MiB tensor from 4 source ranks to 4 replicas, H100 nodes),
# direct and relayed. The replayed time must sit between T_lower and twice
# the cost model's prediction (and above half of it), and the relay plan
# must replay faster than the direct one, as the model says; an fp8 case
# whose blocks span source ranks replays its gathering pre-plan as a
# stage before the main plan, near the prediction (with spreading
# forced, before the spreading pre-plan's: 3 stages); a truncated
# schedule and a platform without the ranks' hosts must fail; a
# per-message cost (--msg-us) must slow the replay, within its bound.
#
#   tests/test_replay.sh RESHARD_PLAN RESHARD_REPLAY
set -euo pipefail
plan=$1 replay=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the platform scripts/simulate.sh replays on (its preset_platform)
eval "$(sed -n '/^preset_platform() {/,/^}/p' "$repo/scripts/simulate.sh")"
preset_platform h100-8x400g 8 4 >"$work/p.xml"
net=(--cfg=network/model:SMPI --cfg=smpi/bw-factor:0:1 --cfg=smpi/lat-factor:0:1 --cfg=surf/precision:1e-9
  --log=root.threshold:warning)
case_args=(--shape 4096,4096 --src-mesh 4 --src-placements S0 --dst-mesh 4 --dst-placements R --topology h100-8x400g
  --no-check)
val() { sed -nE "s/.*$1=([^ ]+).*/\1/p" "$2" | head -n 1; }
declare -A sim
for relay in 0 1; do
  "$plan" "${case_args[@]}" --relay $relay --replay-out "$work/s$relay" >"$work/plan$relay.txt"
  # stdout is the same with and without --replay-out (but for the
  # planning times: its '#' lines without plan_ms)
  "$plan" "${case_args[@]}" --relay $relay >"$work/plain$relay.txt"
  same() { grep '^#' "$1" | grep -v 'plan_ms='; }
  diff <(same "$work/plain$relay.txt") <(same "$work/plan$relay.txt") ||
    { echo "FAIL: --replay-out changed stdout"; exit 1; }
  timeout 120 "$replay" "$work/s$relay" "$work/p.xml" --wall-limit 60 "${net[@]}" >"$work/r$relay.txt"
  cat "$work/r$relay.txt"
  t=$(val simulated_s "$work/r$relay.txt")
  p=$(val predicted_s "$work/plan$relay.txt")
  l=$(val lower_s "$work/plan$relay.txt")
  echo "relay $relay: replay ${t} s, predicted ${p} s, T_lower ${l} s"
  awk -v t="$t" -v p="$p" -v l="$l" 'BEGIN { exit !(t > 0 && t >= 0.95 * l && t >= 0.5 * p && t <= 2 * p) }' ||
    { echo "FAIL: relay $relay: the replay is outside [max(0.95 T_lower, 0.5 predicted), 2 predicted]"; exit 1; }
  sim[$relay]=$t
done
awk -v d="${sim[0]}" -v r="${sim[1]}" 'BEGIN { exit !(r < 0.5 * d) }' ||
  { echo "FAIL: the relay plan (${sim[1]} s) does not replay at under half the direct one (${sim[0]} s)"; exit 1; }
# --msg-us: every data message occupies its route 1 us longer: the relay
# plan replays slower, by more than nothing and less than all of its
# messages one after another; a negative cost is refused
timeout 120 "$replay" "$work/s1" "$work/p.xml" --wall-limit 60 --msg-us 1 "${net[@]}" >"$work/r1m.txt"
t=$(val simulated_s "$work/r1m.txt")
m=$(val messages "$work/r1m.txt")
echo "relay 1 with --msg-us 1: replay ${t} s over ${m} messages (${sim[1]} s without)"
awk -v t="$t" -v b="${sim[1]}" -v m="$m" 'BEGIN { exit !(t > b && t - b <= m * 1e-6) }' ||
  { echo "FAIL: --msg-us 1 added nothing, or more than 1 us per message"; exit 1; }
if "$replay" "$work/s1" "$work/p.xml" --msg-us -1 "${net[@]}" >/dev/null 2>&1; then
  echo "FAIL: --msg-us -1 was accepted"; exit 1
fi
# fp8 blocks of 128 rows over sources of 320: the blocks split across
# them are gathered first, a stage of its own before the main plan's,
# and the prediction adds that pre-plan's time
preset_platform h100-8x400g 5 3 >"$work/p5.xml"
"$plan" --shape 960,4096 --dtype bf16 --src-mesh 3 --src-placements S0 --dst-mesh 2 --dst-placements S1 \
  --dst-dtype fp8e4m3 --block 128,128 --topology h100-8x400g --no-check --replay-out "$work/g" >"$work/planq.txt"
grep -q '^# fp8 gathering: ' "$work/planq.txt" || { echo "FAIL: the fp8 case gathers nothing"; exit 1; }
timeout 120 "$replay" "$work/g" "$work/p5.xml" --wall-limit 60 "${net[@]}" >"$work/rq.txt"
cat "$work/rq.txt"
t=$(val simulated_s "$work/rq.txt")
p=$(val predicted_s "$work/planq.txt")
[[ $(val stages "$work/rq.txt") == 2 ]] || { echo "FAIL: the fp8 gathering pre-plan is not a stage of the replay"; exit 1; }
echo "fp8 gathering: replay ${t} s, predicted ${p} s"
awk -v t="$t" -v p="$p" 'BEGIN { exit !(t >= 0.5 * p && t <= 2 * p) }' ||
  { echo "FAIL: fp8 gathering: the replay is outside [0.5 predicted, 2 predicted]"; exit 1; }
# with spreading forced too, three stages: gathering, spreading, main
RESHARD_SPREAD=2 "$plan" --shape 960,4096 --dtype bf16 --src-mesh 3 --src-placements S0 --dst-mesh 2 \
  --dst-placements S1 --dst-dtype fp8e4m3 --block 128,128 --topology h100-8x400g --no-check --replay-out "$work/g3" \
  >"$work/planq3.txt"
grep -q '^# source-side spreading: .* kept' "$work/planq3.txt" || { echo "FAIL: RESHARD_SPREAD=2 spread nothing"; exit 1; }
timeout 120 "$replay" "$work/g3" "$work/p5.xml" --wall-limit 60 "${net[@]}" >"$work/rq3.txt"
cat "$work/rq3.txt"
[[ $(val stages "$work/rq3.txt") == 3 ]] || { echo "FAIL: gathering + spreading + main are not 3 stages"; exit 1; }
head -n 5 "$work/s1" >"$work/short"
if "$replay" "$work/short" "$work/p.xml" --wall-limit 60 "${net[@]}" >/dev/null 2>&1; then
  echo "FAIL: a truncated schedule replayed"; exit 1
fi
preset_platform h100-8x400g 4 2 >"$work/small.xml"
if "$replay" "$work/s1" "$work/small.xml" --wall-limit 60 "${net[@]}" >/dev/null 2>&1; then
  echo "FAIL: a platform with 4 hosts replayed 8 ranks"; exit 1
fi
echo "tools_replay: ok"
