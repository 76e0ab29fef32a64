#!/usr/bin/env bash
# Script tests of tools/reshard_perf and tools/reshard_plan, one named case
# per ctest test (registered in tools/CMakeLists.txt):
#
#   test_tools.sh CASE PERF|none PLAN MPIEXEC|none [CONFIG_DIR]
#   test_tools.sh perf_nccl PERF PLAN MPIEXEC cuda|nocuda
#
# Every reshard_perf run checks every destination element (-c 1) on
# oversubscribed ranks; every reshard_plan run checks coverage, reads and
# pair agreement (--check). The *_detects_errors cases show that both
# checks can fail, the *_bad_options cases that bad input exits non-zero
# with a clear message.
set -uo pipefail

case_name=$1
perf=$2
plan=$3
mpiexec=$4
config_dir=${5:-}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

failures=0
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

fail() {
  echo "FAIL: $*"
  echo "---- stdout"; tail -n 30 "$out"
  echo "---- stderr"; tail -n 30 "$err"
  failures=$((failures + 1))
}

# Last lines of reshard_perf: the result line, then one line per baseline,
# in order.
perf_tail_ok() {
  local nb=$1 want_wrong=$2
  local n=$((nb + 1))
  local lines
  mapfile -t lines < <(tail -n "$n" "$out")
  [[ ${lines[0]} =~ ^#\ reshard_perf:\ bytes=[0-9]+\ time_us=[0-9]+\.[0-9]\ algbw_GBps=[0-9]+\.[0-9]{3}\ wrong=([0-9]+)$ ]] || return 1
  if [[ $want_wrong == 0 ]]; then
    [[ ${BASH_REMATCH[1]} == 0 ]] || return 1
  else
    [[ ${BASH_REMATCH[1]} -gt 0 ]] || return 1
  fi
  [[ $(grep -c '^# reshard_perf:' "$out") -eq 1 ]] || return 1
  [[ $(grep -c '^# baseline ' "$out") -eq $nb ]] || return 1
  local i
  for ((i = 1; i < n; i++)); do
    [[ ${lines[$i]} =~ ^#\ baseline\ (broadcast|alltoallw):\ time_us=[0-9]+\.[0-9]\ ratio=[0-9]+\.[0-9]{2}$ ]] || return 1
  done
  return 0
}

# perf NP NBASELINES ARGS...: runs reshard_perf with -c 1 and expects
# success, no wrong element and the exact final lines.
perf_ok() {
  local np=$1 nb=$2
  shift 2
  echo "== mpirun -np $np reshard_perf $*"
  if ! "$mpiexec" -np "$np" --oversubscribe "$perf" -c 1 -n 3 -w 1 "$@" >"$out" 2>"$err"; then
    fail "exit status $? for: $*"
    return
  fi
  perf_tail_ok "$nb" 0 || fail "final lines malformed or wrong elements for: $*"
}

plan_ok() {
  echo "== reshard_plan $*"
  if ! "$plan" --check "$@" >"$out" 2>"$err"; then
    fail "exit status $? for: $*"
    return
  fi
  grep -q VIOLATION "$out" && fail "violations reported for: $*"
  tail -n 1 "$out" | grep -Eq '^# reshard_plan: ranks=[0-9]+ plan_ms=[0-9]+\.[0-9]{2} peak_MiB=[0-9]+\.[0-9] coverage=ok$' ||
    fail "last line malformed or coverage not ok for: $*"
}

# reshard_plan --topology: coverage ok, then exactly the result line and one
# line per baseline, in order, last; the plan and every baseline are never
# faster than the physical limit.
plan_topo_ok() {
  echo "== reshard_plan --topology $*"
  if ! "$plan" --check "$@" >"$out" 2>"$err"; then
    fail "exit status $? for: $*"
    return
  fi
  grep -q VIOLATION "$out" && fail "violations reported for: $*"
  grep -Eq '^# reshard_plan: ranks=[0-9]+ plan_ms=[0-9.]+ peak_MiB=[0-9.]+ coverage=ok$' "$out" ||
    fail "no coverage=ok line for: $*"
  local num='[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?' rat='([0-9]+\.[0-9]{3}|inf)'
  local lines
  mapfile -t lines < <(tail -n 4 "$out")
  if [[ ${lines[0]} =~ ^#\ reshard_plan:\ predicted_s=($num)\ lower_s=($num)\ ratio=$rat$ ]]; then
    local x=${BASH_REMATCH[1]} y=${BASH_REMATCH[4]}
    awk -v x="$x" -v y="$y" 'BEGIN { exit !(x + 0 >= y + 0 && x + 0 > 0) }' ||
      fail "predicted_s=$x below lower_s=$y (or zero) for: $*"
  else
    fail "result line malformed for: $* (${lines[0]})"
  fi
  local names=(gather-broadcast replica0-direct balanced-direct) i
  for i in 0 1 2; do
    [[ ${lines[$((i + 1))]} =~ ^#\ baseline\ ${names[$i]}:\ predicted_s=$num\ ratio=$rat$ ]] ||
      fail "baseline line $((i + 1)) malformed for: $* (${lines[$((i + 1))]})"
    [[ ${lines[$((i + 1))]} =~ ratio=0\.([0-9]{3})$ ]] && fail "baseline ${names[$i]} faster than T_lower for: $*"
  done
  [[ $(grep -c '^# reshard_plan: predicted_s=' "$out") -eq 1 ]] || fail "more than one result line for: $*"
}

# bad TOOL EXPECTED_STATUS PATTERN ARGS...: expects that exit status and a
# message matching PATTERN on stderr.
bad() {
  local tool=$1 want=$2 pattern=$3
  shift 3
  echo "== (expected to fail) $tool $*"
  local rc
  if [[ $tool == plan ]]; then
    "$plan" "$@" >"$out" 2>"$err"
    rc=$?
  else
    "$mpiexec" -np "$NP" --oversubscribe "$perf" "$@" >"$out" 2>"$err"
    rc=$?
  fi
  if [[ $want == nonzero ]]; then
    [[ $rc -ne 0 ]] || fail "exit status 0, expected non-zero, for: $*"
  else
    [[ $rc -eq $want ]] || fail "exit status $rc, expected $want, for: $*"
  fi
  grep -Eq -e "$pattern" "$err" || fail "no message matching '$pattern' for: $*"
}

# show_ok ARGS...: reshard_plan --show-layout exits 0 and prints only '#'
# lines and fragment lines of the documented format.
show_ok() {
  echo "== reshard_plan $*"
  if ! "$plan" "$@" >"$out" 2>"$err"; then
    fail "exit status $? for: $*"
    return
  fi
  grep -Evq '^#|^rank=[0-9]+ name=[^ ]+ tensor=[^ ]+ dtype=[a-z0-9_]+ box=([0-9]+:[0-9]+(,[0-9]+:[0-9]+)*)? offset=[0-9]+$' "$out" &&
    fail "a line neither '#' nor a fragment line for: $*"
  grep -q '^rank=' "$out" || fail "no fragment line for: $*"
}

# json_ok ARGS...: reshard_plan --check --json FILE ARGS... exits 0 with
# coverage ok; FILE is valid JSON (python3 -m json.tool) and agrees with
# what the tool printed: the world, the totals row, per-rank bytes, the
# pairs' and the rounds' sums, and with --topology the predicted time,
# T_lower and the baselines (printed with %.6g), the rounds' durations
# adding up to the prediction (less the spreading and fp8 gathering
# pre-plans'); and the run
# without --json prints the same figures (tests/plan_golden.sh: byte for
# byte).
json_ok() {
  local json
  json=$(mktemp --suffix=.json)
  echo "== reshard_plan --json $*"
  if ! "$plan" --check --json "$json" "$@" >"$out" 2>"$err"; then
    fail "exit status $? for: --json $*"
    rm -f "$json"
    return
  fi
  python3 -m json.tool "$json" >/dev/null 2>>"$err" || fail "python3 -m json.tool rejects the file of: $*"
  python3 - "$json" "$out" >>"$err" 2>&1 <<'EOF' || fail "the JSON disagrees with stdout for: $*"
import json, re, sys
d = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read().splitlines()
def want(ok, what):
    if not ok:
        sys.exit("JSON check failed: " + what)
w = re.search(r"^# world (\d+) \((\d+) source, (\d+) destination", "\n".join(out), re.M)
want(w and (d["world"], d["sources"], d["destinations"]) == tuple(map(int, w.groups())), "world")
want(d["schema"] == "reshard-plan" and d["version"] == 1, "schema")
rows = [l.split() for l in out if re.match(r"^ +\d+ +(src|dst|both|none) ", l)]
want(len(rows) == d["world"] == len(d["ranks"]), "one rank entry per table row")
for row, r in zip(rows, d["ranks"]):
    want(int(row[0]) == r["rank"] and row[1] == r["role"], "rank %s role" % row[0])
    want("%.2f" % (r["send_bytes"] / 1048576) == row[5] and "%.2f" % (r["recv_bytes"] / 1048576) == row[6],
         "rank %s bytes" % row[0])
    want(int(row[8]) == r["send_messages"] and int(row[10]) == r["send_peers"] and int(row[12]) == r["rounds"], "rank %s messages" % row[0])
total = next(l.split() for l in out if l.split()[:1] == ["total"])
t = d["totals"]
want("%.2f" % (t["send_bytes"] / 1048576) == total[1] and int(total[4]) == t["send_messages"], "totals row")
want(sum(p["bytes"] for p in d["pairs"]) == t["send_bytes"], "pairs sum to the bytes sent")
want(sum(p["messages"] for p in d["pairs"]) == t["send_messages"], "pairs sum to the messages sent")
want(sum(r["bytes"] for r in d["rounds"]) == t["send_bytes"], "rounds sum to the bytes sent")
res = [l for l in out if l.startswith("# reshard_plan: predicted_s=")]
if not res:
    want(d["topology"] is None and d["estimate"] is None, "no topology, no estimate")
    want(all(r["links"] is None for r in d["rounds"]), "no topology, no links")
    sys.exit(0)
m = re.match(r"# reshard_plan: predicted_s=(\S+) lower_s=(\S+)", res[0])
e = d["estimate"]
want("%.6g" % e["predicted_s"] == m.group(1), "predicted_s %r vs %s" % (e["predicted_s"], m.group(1)))
want("%.6g" % e["lower_s"] == m.group(2), "lower_s")
for l in out:
    b = re.match(r"# baseline (\S+): predicted_s=(\S+) ratio", l)
    if b:
        want("%.6g" % d["baselines"][b.group(1)] == b.group(2), "baseline " + b.group(1))
pre = (d["spreading"]["pre_plan_s"] if d["spreading"] else 0.0) + (d["gathering"]["pre_plan_s"] if d["gathering"] else 0.0)
if any(l.startswith("# fp8 gathering: ") for l in out):
    want(d["gathering"] and d["gathering"]["pre_plan_s"] > 0, "the fp8 gathering pre-plan priced")
rounds_s = sum(r["seconds"] or 0 for r in d["rounds"])
want(abs(rounds_s + pre - e["predicted_s"]) <= 1e-9 * max(1.0, e["predicted_s"]), "rounds add up to the prediction")
for r in d["rounds"]:
    if r["links"]:
        busiest = max(l["seconds"] for l in r["links"].values() if l)
        want(r["seconds"] >= busiest - 1e-15, "round %d shorter than its busiest link" % r["round"])
want(all(x["node"] is not None for x in d["ranks"]), "nodes from the topology")
EOF
  # the same run without --json prints the same figures
  local with=$out.with
  cp "$out" "$with"
  "$plan" --check "$@" >"$out" 2>"$err" || fail "exit status $? without --json for: $*"
  diff <(grep -E '^ +total |^# (reshard_plan: predicted_s|baseline|T_lower|checks)' "$with") \
       <(grep -E '^ +total |^# (reshard_plan: predicted_s|baseline|T_lower|checks)' "$out") >/dev/null ||
    fail "stdout differs with --json for: $*"
  rm -f "$json" "$with"
}

# has LINE: the last run printed exactly this line.
has() { grep -Fxq -- "$1" "$out" || fail "missing line: $1"; }

BOTH="--baseline broadcast,alltoallw"

case $case_name in
plan_synthetic)
  plan_ok --shape 64,48 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1
  show_ok --shape 8,6 --src-mesh 2 --src-placements S0 --dst-mesh 3 --dst-placements S1 --show-layout dst
  has "rank=2 name=tensor tensor=tensor dtype=f32 box=0:8,0:2 offset=0"
  has "rank=4 name=tensor tensor=tensor dtype=f32 box=0:8,4:6 offset=0"
  plan_ok --shape 64,48 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1 --staging 4096
  plan_ok --shape 37,53,5 --dtype bf16 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 3 --dst-placements S2 --staging 4K
  plan_ok --shape 37,53 --src-mesh 2,2 --src-placements S1,S0 --dst-mesh 4 --dst-placements S1 --colocate --staging 4K
  plan_ok --shape 100,9 --dtype u8 --src-mesh 4 --src-placements S0 --dst-mesh 2 --dst-placements S1 --colocate
  plan_ok --shape 41,17 --dtype f64 --src-mesh 2,2 --src-placements S0,S0 --dst-mesh 3 --dst-placements S0 --world 10
  plan_ok --shape 5 --dtype i64 --src-mesh 2 --src-placements R --dst-mesh 8 --dst-placements S0
  plan_ok --shape 6,0 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1
  plan_ok --shape 12,10,8,3 --dtype fp8e4m3 --src-mesh 2,1,2 --src-placements S3,R,S1 --dst-mesh 2,2 --dst-placements S2,S0 --staging 4K
  # dtype conversion: casts in the packs, unpacks and local copies
  plan_ok --shape 64,48 --src-mesh 2 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 --dst-dtype bf16
  plan_ok --shape 37,53 --dtype bf16 --src-mesh 2,2 --src-placements S1,S0 --dst-mesh 4 --dst-placements S1 --colocate --staging 4K --dst-dtype f32
  RESHARD_RELAY=1 plan_ok --shape 1024,64 --src-mesh 2 --src-placements S0 --dst-mesh 4,2 --dst-placements R,S0 --dst-dtype fp8e4m3
  # fp8 block quantization: codes and scales placed alike; rows cut through blocks (gathered first)
  plan_ok --shape 64,96 --dtype bf16 --src-mesh 2 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 --dst-dtype fp8e4m3 --block 16,32
  plan_ok --shape 30,40 --dtype f32 --src-mesh 4 --src-placements S0 --dst-mesh 2 --dst-placements S1 --dst-dtype fp8e4m3 --block 4,8 --colocate
  # a zero-size dimension: no blocks (issue 42, defect 9: qsort(NULL, 0) under UBSan)
  plan_ok --shape 8,0 --dst-dtype fp8e4m3 --block 3,3 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1
  # relay plans: forwards read destination buffers, several messages of a
  # pair share a round (fragments of 512 KiB per replica part: relayed)
  RESHARD_RELAY=1 plan_ok --shape 1024,1024 --src-mesh 2 --src-placements S0 --dst-mesh 4,2 --dst-placements R,S0
  RESHARD_RELAY=1 plan_ok --shape 2048,512 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4,1 --dst-placements R,S1 --staging 64K
  # one rank alone: its figures, coverage skipped
  echo "== reshard_plan --rank 5"
  if "$plan" --shape 64,48 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 --rank 5 --check >"$out" 2>"$err"; then
    tail -n 1 "$out" | grep -Eq '^# reshard_plan: ranks=1 plan_ms=[0-9.]+ peak_MiB=[0-9.]+ coverage=skipped$' ||
      fail "--rank: last line"
    grep -Eq '^ +5 +dst ' "$out" || fail "--rank: no row for rank 5"
  else
    fail "--rank 5 exited non-zero"
  fi
  ;;
plan_json)
  # reshard_plan --json: synthetic cases, with and without a topology,
  # colocated, relayed; model cases with a config dir (spreading kept)
  S="--shape 256,192 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1"
  json_ok $S
  json_ok $S --topology h100-8x400g
  json_ok $S --topology cpu --relay 0
  json_ok --shape 64,48 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1 --colocate --topology h100-8x400g
  json_ok --shape 1024,1024 --src-mesh 2 --src-placements S0 --dst-mesh 4,2 --dst-placements R,S0 --relay 1 --topology gb200-nvl72
  # fp8 blocks of 48 rows over sources of 32: gathered first, the pre-plan priced
  json_ok --shape 96,64 --dtype bf16 --src-mesh 3 --src-placements S0 --dst-mesh 2 --dst-placements S1 --dst-dtype fp8e4m3 \
    --block 48,32 --topology h100-8x400g
  grep -Eq '^# fp8 gathering: .* the prediction adds it$' "$out" || fail "the fp8 gathering pre-plan not priced"
  if [[ -n $config_dir ]]; then
    json_ok --model-config "$config_dir/tiny_moe.json" --train tp=1,pp=2,dp=2,ep=2 --infer tp=2,dp=2,ep=4 --topology h100-8x400g
    json_ok --model-config "$repo/configs/DeepSeek-V3.json" --layers 4 --train tp=1,pp=4,dp=8,ep=8 --infer tp=8,dp=4 \
      --topology gb200-nvl72
    grep -q 'source-side spreading: .* kept' "$out" || fail "the spreading case no longer spreads"
  fi
  bad plan 2 "--json describes every rank's plan, which --rank skips" $S --json /tmp/x.json --rank 1
  bad plan 2 "--json needs a file name" $S --json ""
  bad plan 1 "--json '/nonexistent/dir/p.json'" $S --json /nonexistent/dir/p.json
  ;;
plan_topology)
  S="--shape 256,192 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1"
  plan_topo_ok $S --topology h100-8x400g
  plan_topo_ok $S --topology gb200-nvl72 --staging 64K
  plan_topo_ok $S --topology cpu --relay 0
  plan_topo_ok --shape 64,48 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1 --colocate --topology h100-8x400g
  plan_topo_ok --shape 37,53 --dtype bf16 --src-mesh 2,2 --src-placements S1,S0 --dst-mesh 3 --dst-placements S0 --world 9 --topology cpu
  bad plan 2 "--topology 'tpu': unknown preset" $S --topology tpu
  bad plan 2 "--topology prices every rank's plan" $S --topology cpu --rank 1
  bad plan 2 "--relay '2': expected -1" $S --relay 2
  RESHARD_TIMEOUT_MS=0 bad plan nonzero "RESHARD_TIMEOUT_MS=0: every wait needs a deadline of at least 1 ms" $S
  # the environment asking for the relay choice again, which the tool's
  # staged planning has made: refused with the reason, not planned empty
  RESHARD_RELAY=-1 bad plan 1 "staged planning needs relay 0 or 1" $S --topology h100-8x400g
  ;;
plan_detects_errors)
  echo "== reshard_plan --inject-error --check"
  "$plan" --shape 37,53 --src-mesh 2,2 --src-placements S1,S0 --dst-mesh 4 --dst-placements S1 --colocate \
    --staging 4K --check --inject-error >"$out" 2>"$err"
  rc=$?
  [[ $rc -eq 1 ]] || fail "--inject-error --check: exit status $rc, expected 1"
  grep -q "never written" "$out" || fail "--inject-error: the unwritten bytes were not reported"
  tail -n 1 "$out" | grep -q 'coverage=FAILED$' || fail "--inject-error: coverage not FAILED"
  echo "== reshard_plan --inject-error (no --check: reported, exit 0)"
  "$plan" --shape 64,48 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 --inject-error >"$out" 2>"$err"
  rc=$?
  [[ $rc -eq 0 ]] || fail "--inject-error without --check: exit status $rc, expected 0"
  tail -n 1 "$out" | grep -q 'coverage=FAILED$' || fail "--inject-error without --check: coverage not FAILED"
  ;;
plan_bad_options)
  S="--shape 64,48 --src-mesh 4 --src-placements S0 --dst-mesh 2,2"
  # an unusable RESHARD_* value is said on stderr without RESHARD_DEBUG, and
  # the default stays in force (the run succeeds)
  echo "== RESHARD_TIMEOUT_MS=abc RESHARD_DEBUG=LOUD reshard_plan ..."
  RESHARD_TIMEOUT_MS=abc RESHARD_DEBUG=LOUD "$plan" $S --dst-placements R,S1 >"$out" 2>"$err" ||
    fail "a malformed RESHARD_TIMEOUT_MS failed the run"
  grep -q "ignoring RESHARD_TIMEOUT_MS=abc: not an integer" "$err" || fail "no warning for RESHARD_TIMEOUT_MS=abc"
  grep -q "ignoring RESHARD_DEBUG=LOUD" "$err" || fail "no warning for RESHARD_DEBUG=LOUD"
  bad plan 2 "S5 shards dim 5 but --shape has 2 dims" $S --dst-placements R,S5
  bad plan 2 "expected R or S<dim>" $S --dst-placements R,X1
  bad plan 2 "has 1 placement but --dst-mesh has 2 axes" $S --dst-placements S1
  bad plan 2 "unknown dtype" $S --dst-placements R,S1 --dtype f17
  bad plan 2 "--dst-dtype 'f17': unknown dtype" $S --dst-placements R,S1 --dst-dtype f17
  bad plan 1 "only f32, bf16, f16, fp8e4m3 and fp8e5m2 convert" $S --dst-placements R,S1 --dst-dtype i32
  bad plan 2 "unknown option '--frobnicate'" $S --dst-placements R,S1 --frobnicate
  bad plan 2 "--block quantizes the destination in fp8 blocks" $S --dst-placements R,S1 --block 4,4
  bad plan 2 "--block '4': expected two sizes" $S --dst-placements R,S1 --dst-dtype fp8e4m3 --block 4
  bad plan 2 "--infer-dtype 'bf16': only fp8e4m3" --model-config x.json --train tp=2 --infer tp=2 --infer-dtype bf16
  bad plan 2 "synthetic mode needs --dst-placements" $S
  bad plan 2 "cannot be mixed" $S --dst-placements R,S1 --train tp=2
  bad plan 2 "--world 7 is too small" $S --dst-placements R,S1 --world 7
  bad plan 2 "--rank 8 is outside the 8 ranks" $S --dst-placements R,S1 --rank 8
  bad plan 2 "--staging '0'" $S --dst-placements R,S1 --staging 0
  bad plan 2 "--shape '4096,x'" --shape 4096,x --src-mesh 4 --src-placements S0 --dst-mesh 2 --dst-placements S1
  bad plan 2 "--src-mesh '0'" --shape 8 --src-mesh 0 --src-placements S0 --dst-mesh 2 --dst-placements S0
  bad plan 2 "no reshard described" --staging 4K
  bad plan 1 "staging_bytes 2048 is below the minimum" $S --dst-placements R,S1 --staging 2K
  ;;
perf_np2)
  NP=2
  perf_ok 2 2 --shape 64,48 --src-mesh 1 --src-placements R --dst-mesh 1 --dst-placements R $BOTH
  perf_ok 2 2 --shape 64,48 --dtype bf16 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 --colocate $BOTH
  perf_ok 2 1 --shape 1001 --dtype u8 --src-mesh 1 --src-placements S0 --dst-mesh 1 --dst-placements S0 --baseline alltoallw
  perf_ok 2 0 --shape 33,65 --dtype f64 --src-mesh 2 --src-placements S1 --dst-mesh 1 --dst-placements R --colocate --staging 4K
  ;;
perf_np4)
  perf_ok 4 2 --shape 24,30,7 --dtype f16 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S2 $BOTH
  perf_ok 4 2 --shape 64,48 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1 --colocate --staging 4K $BOTH
  perf_ok 4 2 --shape 17,19 --dtype i64 --src-mesh 2 --src-placements R --dst-mesh 2 --dst-placements R $BOTH
  perf_ok 4 2 --shape 10,7 --dtype bool --src-mesh 1 --src-placements R --dst-mesh 3 --dst-placements S0 $BOTH
  perf_ok 4 1 --shape 37,53 --dtype i32 --src-mesh 2,2 --src-placements S1,S0 --dst-mesh 2,2 --dst-placements S0,S1 --colocate --baseline broadcast
  # dtype conversion, every element checked against the self-test's reference casts
  perf_ok 4 0 --shape 24,30,7 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S2 --dst-dtype bf16
  perf_ok 4 0 --shape 64,48 --dtype f16 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1 --colocate --staging 4K --dst-dtype fp8e5m2
  perf_ok 4 0 --shape 61,37 --dtype fp8e4m3 --src-mesh 2 --src-placements S1 --dst-mesh 2 --dst-placements R --dst-dtype f32
  grep -q '^# values: finite (weight-like floats)$' "$out" || fail "--dst-dtype: the values are not finite by default"
  # ... and every bit pattern (NaNs, infinities) on request
  perf_ok 4 0 --shape 24,30,7 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S2 --dst-dtype fp8e5m2 --values bits
  grep -q '^# values: bits (every bit pattern)$' "$out" || fail "--values bits: no values line"
  # fp8 block quantization, every code and scale checked against the self-test's reference quantizer
  perf_ok 4 0 --shape 48,40 --dtype bf16 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 --dst-dtype fp8e4m3 --block 4,4
  perf_ok 4 0 --shape 3,33,20 --dtype f16 --src-mesh 2,2 --src-placements R,S1 --dst-mesh 4 --dst-placements S2 --colocate --dst-dtype fp8e4m3 --block 5,3
  perf_ok 4 0 --shape 48,40 --dtype bf16 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 --dst-dtype fp8e4m3 --block 4,4 --values bits
  # a tensor whose second first-replica fragment is never reached by the
  # broadcast baseline's setup (the first is over one gather message): the
  # baseline is skipped, and its cleanup frees only the handles it made
  # (a zeroed handle was freed before: a crash on Open MPI and SMPI)
  echo "== broadcast baseline skipped, RESHARD_PERF_BCAST_MAX_MSG=1000"
  if RESHARD_PERF_BCAST_MAX_MSG=1000 "$mpiexec" -np 4 --oversubscribe "$perf" -c 1 -n 2 -w 1 \
      --shape 64,48 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 --baseline broadcast >"$out" 2>"$err"; then
    grep -Eq '^# baseline broadcast: skipped \(tensor .tensor.: a source fragment of 6144 bytes exceeds one gather message\)$' "$out" ||
      fail "broadcast skip: no skipped line"
    grep -Eq '^# reshard_perf: bytes=[0-9]+ time_us=[0-9.]+ algbw_GBps=[0-9.]+ wrong=0$' "$out" || fail "broadcast skip: reshard line"
  else
    fail "broadcast skip: exit status $?"
  fi
  # the cost model's prediction beside the measurement, final lines unchanged
  for topo in cpu h100-8x400g; do
    perf_ok 4 1 --shape 64,48 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 --topology $topo --baseline broadcast
    grep -Eq "^# cost model \($topo\): predicted_us=[0-9]+\.[0-9] over [0-9]+ rounds, bound by [a-z-]+ at -?[0-9]+ \(latency [0-9.]+ us\); T_lower_us=[0-9]+\.[0-9] \([a-z-]+\)$" "$out" ||
      fail "--topology $topo: no cost model line"
  done
  # the alltoallw baseline's other datatype path (nested hvectors)
  export RESHARD_PERF_HVECTOR=1
  perf_ok 4 1 --shape 24,30,7 --dtype f16 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S2 --baseline alltoallw
  perf_ok 4 1 --shape 37,53 --dtype i32 --src-mesh 2,2 --src-placements S1,S0 --dst-mesh 2,2 --dst-placements S0,S1 --colocate --baseline alltoallw
  unset RESHARD_PERF_HVECTOR
  # --verify: the flagged plan runs as one more method, checked, and its
  # cost is printed just before the result line
  perf_ok 4 1 --shape 24,30,7 --dtype f16 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S2 --verify --baseline broadcast
  grep -Eq '^ +verify +[0-9]+ .* 0$' "$out" || fail "--verify: no checked 'verify' row"
  grep -B1 '^# reshard_perf:' "$out" | head -n 1 | grep -Eq '^# verify: time_us=[0-9]+\.[0-9] ratio=[0-9]+\.[0-9]{2}$' ||
    fail "--verify: no '# verify: time_us= ratio=' line before the result line"
  ;;
perf_np8)
  # the layouts of the performance targets, small
  perf_ok 8 2 --shape 256,192 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 $BOTH
  perf_ok 8 2 --shape 256,192 --src-mesh 2,2 --src-placements R,S0 --dst-mesh 4 --dst-placements S1 $BOTH
  perf_ok 8 2 --shape 61,37,3 --dtype fp8e5m2 --src-mesh 2,2 --src-placements S2,S0 --dst-mesh 2,2 --dst-placements R,S1 --staging 4K $BOTH
  perf_ok 8 2 --shape 96,40 --dtype u32 --src-mesh 2,4 --src-placements R,S1 --dst-mesh 8 --dst-placements S0 --colocate $BOTH
  perf_ok 8 2 --shape 50,50 --dtype bf16 --src-mesh 4 --src-placements S1 --dst-mesh 2,2 --dst-placements S0,S0 $BOTH
  # an all-to-all between two nodes in 64K of staging: the plan takes phases
  # (a stream sends one round in 4), every element still checked over MPI
  perf_ok 8 0 --shape 256,4096 --src-mesh 4 --src-placements S0 --dst-mesh 4 --dst-placements S1 --topology h100-8x400g --staging 64K
  grep -Eq '^# plan: .* in [2-9][0-9]* phases' "$out" || fail "--topology all-to-all: expected more than one phase"
  ;;
perf_bad_options)
  NP=3
  bad perf nonzero "3 MPI ranks, but the layouts need exactly 8" --shape 64,48 --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1
  bad perf nonzero "3 MPI ranks, but the layouts need exactly 4" --shape 64,48 --src-mesh 4 --src-placements S0 --dst-mesh 2 --dst-placements S1 --colocate
  bad perf nonzero "S2 shards dim 2 but --shape has 2 dims" --shape 64,48 --src-mesh 3 --src-placements S2 --dst-mesh 3 --dst-placements S1 --colocate
  bad perf nonzero "unknown baseline 'nccl'" --shape 64,48 --src-mesh 3 --src-placements S0 --dst-mesh 3 --dst-placements S1 --colocate --baseline broadcast,nccl
  bad perf nonzero "--values 'floats': expected auto, bits or finite" --shape 64,48 --src-mesh 3 --src-placements S0 --dst-mesh 3 --dst-placements S1 --colocate --values floats
  bad perf nonzero "-c '2': expected 0 or 1" --shape 64,48 --src-mesh 3 --src-placements S0 --dst-mesh 3 --dst-placements S1 --colocate -c 2
  bad perf nonzero "--topology 'tpu': unknown preset" --shape 64,48 --src-mesh 3 --src-placements S0 --dst-mesh 3 --dst-placements S1 --colocate --topology tpu
  bad perf nonzero "the baselines move bytes as they are" --shape 64,48 --src-mesh 3 --src-placements S0 --dst-mesh 3 --dst-placements S1 --colocate --dst-dtype bf16 --baseline broadcast
  bad perf nonzero "unknown option '--world'" --shape 64,48 --src-mesh 3 --src-placements S0 --dst-mesh 3 --dst-placements S1 --colocate --world 3
  ;;
perf_detects_errors)
  echo "== mpirun -np 4 reshard_perf --inject-error"
  "$mpiexec" -np 4 --oversubscribe "$perf" --shape 37,53 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S1 \
    -c 1 -n 2 -w 0 $BOTH --inject-error >"$out" 2>"$err"
  rc=$?
  [[ $rc -ne 0 ]] || fail "--inject-error: exit status 0"
  perf_tail_ok 2 1 || fail "--inject-error: final lines malformed or wrong=0"
  [[ $(grep -c ' wrong$' "$err") -ge 3 ]] || fail "--inject-error: every method should report the corrupted element"
  ;;
perf_ucx)
  # --ucx (a build with UCX): the same plan over a UCX communicator of the
  # same ranks runs as one more method, checked byte for byte, and its
  # cost is printed beside the MPI plan's; so does a second UCX plan with
  # its buffers registered (one-sided reads: row ucx-reg)
  perf_ok 4 0 --shape 96,40 --dtype f32 --src-mesh 4 --src-placements S0 --dst-mesh 4 --dst-placements S1 --colocate --ucx
  grep -Eq '^ +ucx +[0-9]+ .* 0$' "$out" || fail "--ucx: no checked 'ucx' row"
  grep -Eq '^ +ucx-reg +[0-9]+ .* 0$' "$out" || fail "--ucx: no checked 'ucx-reg' row"
  grep -B2 '^# reshard_perf:' "$out" | head -n 2 | tr '\n' '|' |
    grep -Eq '^# ucx: time_us=[0-9]+\.[0-9] ratio=[0-9]+\.[0-9]{2}\|# ucx-reg: time_us=[0-9]+\.[0-9] ratio=[0-9]+\.[0-9]{2}\|$' ||
    fail "--ucx: no '# ucx: time_us= ratio=' and '# ucx-reg: ...' lines before the result line"
  perf_ok 4 1 --shape 24,30,7 --dtype f16 --src-mesh 2 --src-placements S0 --dst-mesh 2 --dst-placements S2 --ucx --verify --baseline broadcast
  grep -Eq '^ +verify +[0-9]+ .* 0$' "$out" && grep -Eq '^ +ucx +[0-9]+ .* 0$' "$out" ||
    fail "--ucx --verify: no checked 'verify' and 'ucx' rows"
  ;;
perf_nccl)
  # $5: whether this build has the CUDA backend
  NP=1
  S1="--shape 64,48 --dtype bf16 --src-mesh 1 --src-placements R --dst-mesh 1 --dst-placements S1 --colocate"
  if [[ $config_dir != cuda ]]; then
    bad perf 2 "--backend nccl: this build has no CUDA backend" $S1 --backend nccl
  else
    bad perf 2 "--baseline with --backend nccl: the baselines move host buffers" $S1 --backend nccl --baseline broadcast
    bad perf 2 "--backend 'gloo': expected mpi, nccl, ipc or ucx-cuda" $S1 --backend gloo
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
      # a GPU: checked runs, local device copies only
      perf_ok 1 0 $S1 --backend nccl
      perf_ok 1 0 --shape 37,53,5 --dtype f32 --src-mesh 1 --src-placements S0 --dst-mesh 1 --dst-placements S2 \
        --colocate --staging 4K --backend nccl
    else
      # no GPU: a clean failure naming the CUDA error, no hang
      echo "== (no GPU: expected to fail cleanly) mpirun -np 1 reshard_perf --backend nccl"
      timeout 120 "$mpiexec" -np 1 --oversubscribe "$perf" $S1 --backend nccl -c 1 >"$out" 2>"$err"
      rc=$?
      [[ $rc -ne 0 ]] || fail "--backend nccl without a GPU: exit status 0"
      [[ $rc -ne 124 ]] || fail "--backend nccl without a GPU: hung (killed after 120 s)"
      grep -Eq -e "--backend nccl: no usable CUDA device: cudaGetDeviceCount(: cuda[A-Za-z]+ \(| found none)" "$err" ||
        fail "--backend nccl without a GPU: no message naming the CUDA error"
      grep -q '^# reshard_perf:' "$out" && fail "--backend nccl without a GPU: printed a result line"
      echo "== (no GPU: expected to fail cleanly) mpirun -np 2 reshard_perf --backend ipc"
      timeout 120 "$mpiexec" -np 2 --oversubscribe "$perf" --shape 64,48 --src-mesh 1 --src-placements R \
        --dst-mesh 1 --dst-placements S1 --backend ipc -c 1 >"$out" 2>"$err"
      rc=$?
      [[ $rc -ne 0 ]] || fail "--backend ipc without a GPU: exit status 0"
      [[ $rc -ne 124 ]] || fail "--backend ipc without a GPU: hung (killed after 120 s)"
      grep -Eq -e "--backend ipc: no usable CUDA device" "$err" ||
        fail "--backend ipc without a GPU: no message naming the CUDA error"
      # (a build with UCX: the backend exists)
      if [[ $(ldd "$perf" 2>/dev/null) == *libucp* ]]; then
        echo "== (no GPU: expected to fail cleanly) mpirun -np 2 reshard_perf --backend ucx-cuda"
        timeout 120 "$mpiexec" -np 2 --oversubscribe "$perf" --shape 64,48 --src-mesh 1 --src-placements R \
          --dst-mesh 1 --dst-placements S1 --backend ucx-cuda -c 1 >"$out" 2>"$err"
        rc=$?
        [[ $rc -ne 0 ]] || fail "--backend ucx-cuda without a GPU: exit status 0"
        [[ $rc -ne 124 ]] || fail "--backend ucx-cuda without a GPU: hung (killed after 120 s)"
        grep -Eq -e "--backend ucx-cuda: no usable CUDA device" "$err" ||
          fail "--backend ucx-cuda without a GPU: no message naming the CUDA error"
      fi
    fi
  fi
  ;;
plan_model)
  D=$config_dir/tiny_dense.json
  M=$config_dir/tiny_moe.json
  plan_ok --model-config "$D" --train tp=2,pp=2 --infer tp=2,dp=2
  plan_ok --model-config "$D" --train tp=2,pp=2,dp=2 --infer tp=4 --colocate --staging 16K
  plan_ok --model-config "$D" --train tp=1 --infer tp=8 --staging 8K
  plan_ok --model-config "$M" --train tp=2,ep=2,etp=1 --infer tp=2,dp=2,ep=4
  plan_ok --model-config "$M" --train tp=1,pp=2,dp=2,ep=2 --infer tp=1,pp=2,dp=2,ep=2 --colocate --staging 8K
  plan_ok --model-config "$repo/configs/Qwen2.5-0.5B.json" --layers 1 --train tp=2,pp=1 --infer tp=2,dp=2
  # FSDP2 / HSDP trainers (rm_fsdp_layout); MoE and Megatron keys refused
  plan_ok --model-config "$D" --train fsdp:dp_shard=3 --infer tp=2,dp=2
  plan_ok --model-config "$D" --train fsdp:dp_shard=2,dp_replicate=2 --infer tp=4 --colocate --staging 8K
  plan_ok --model-config "$D" --train megatron:tp=2 --infer tp=2
  bad plan 2 "MoE model" --model-config "$M" --train fsdp:dp_shard=2 --infer tp=2
  bad plan 2 "key 'tp' is not FSDP2's" --model-config "$D" --train fsdp:dp_shard=2,tp=2 --infer tp=2
  # the checkpoint's own tensors: one per expert, fp8 with block scales
  Q=$repo/tests/data/tiny-deepseek-v3-fp8.json
  plan_ok --model-config "$Q" --per-expert --train tp=2,pp=2,dp=2,ep=4,etp=1 --infer tp=4,ep=4
  plan_ok --model-config "$Q" --per-expert --block-scales --train tp=2,dp=2,ep=2,etp=2 --infer tp=2,dp=2,ep=4 --staging 8K
  plan_ok --model-config "$Q" --block-scales --train tp=2,pp=2,ep=2,etp=1 --infer tp=4,ep=4 --colocate
  bad plan 2 "weight_scale_inv cannot be split" --model-config "$Q" --block-scales --train tp=4,etp=4 --infer tp=2
  bad plan 2 "quantization_config.weight_block_size" --model-config "$repo/tests/data/tiny-deepseek-v3.json" --block-scales --train tp=2 --infer tp=2
  plan_ok --model-config "$Q" --infer-dtype fp8e4m3 --train tp=2,pp=2,ep=2,etp=1 --infer tp=4,ep=4
  bad plan 2 "or give --block R,C" --model-config "$repo/tests/data/tiny-deepseek-v3.json" --infer-dtype fp8e4m3 --train tp=2 --infer tp=2
  plan_topo_ok --model-config "$M" --train tp=1,pp=2,dp=2,ep=2 --infer tp=2,dp=2,ep=4 --topology h100-8x400g
  plan_topo_ok --model-config "$D" --train tp=2,pp=2 --infer tp=2,dp=2 --colocate --topology cpu
  # source-side spreading (src/plan/spread.h): with dp=8, ep=8 the last
  # stage's experts have one replica; the spread plan is kept, priced with
  # its pre-plan, and RESHARD_SPREAD=0 turns it off
  DS="--model-config $repo/configs/DeepSeek-V3.json --layers 4 --train tp=1,pp=4,dp=8,ep=8 --infer tp=8,dp=4"
  plan_topo_ok $DS --topology gb200-nvl72
  grep -Eq '^# source-side spreading: [0-9.]+ MiB .* kept \(the report' "$out" || fail "spreading not kept: $DS"
  RESHARD_SPREAD=0 plan_topo_ok $DS --topology gb200-nvl72
  grep -q 'source-side spreading' "$out" && fail "RESHARD_SPREAD=0 still spread: $DS"
  bad plan 2 "--train 'tq=2'" --model-config "$D" --train tq=2 --infer tp=2
  bad plan 2 "--infer" --model-config "$D" --train tp=2 --infer tp=3
  bad plan 2 "--model-config '/nonexistent.json'" --model-config /nonexistent.json --train tp=2 --infer tp=2
  # --show-layout: the framework's names on each rank (golden lines of
  # tests/unit/test_model_layouts.c; destination ranks follow the 4 source ranks)
  T=$repo/tests/data/tiny-deepseek-v3.json
  show_ok --model-config "$T" --train tp=2,pp=2,ep=2,etp=1 --infer tp=2,dp=2,ep=4 --show-layout dst --rank 7
  has "rank=7 name=model.layers.1.mlp.experts.routed_experts.w13_weight tensor=model.layers.1.mlp.experts.gate_proj.weight dtype=bf16 box=6:8,0:16,0:64 offset=0"
  has "rank=7 name=model.layers.1.mlp.shared_experts.gate_up_proj.weight tensor=model.layers.1.mlp.shared_experts.up_proj.weight dtype=bf16 box=0:32,0:64 offset=4096"
  grep '^rank=' "$out" | grep -vq '^rank=7 ' && fail "--rank 7 printed another rank"
  show_ok --model-config "$T" --train tp=2,pp=2,ep=2,etp=1 --infer tp=2,dp=2,ep=4 --show-layout src
  has "rank=3 name=decoder.layers.1.mlp.router.expert_bias tensor=model.layers.3.mlp.gate.e_score_correction_bias dtype=f32 box=0:8 offset=0"
  has "rank=0 name=embedding.word_embeddings.weight tensor=model.embed_tokens.weight dtype=bf16 box=0:500,0:64 offset=0"
  [[ $(grep -c '^rank=' "$out") -eq $(grep -c '^rank=[0-3] ' "$out") ]] || fail "--show-layout src printed a destination rank"
  "$plan" --model-config "$T" --train tp=2 --infer tp=2 --show-layout dst --rank 1 >"$out" 2>"$err" || fail "--rank on the other side"
  grep -q '^# rank 1 holds nothing on the destination side' "$out" || fail "no word for a rank outside the side"
  bad plan 2 "--show-layout 'both': expected src or dst" --model-config "$T" --train tp=2 --infer tp=2 --show-layout both
  bad plan 2 "plans nothing" --model-config "$T" --train tp=2 --infer tp=2 --show-layout src --topology cpu
  ;;
perf_model)
  D=$config_dir/tiny_dense.json
  M=$config_dir/tiny_moe.json
  perf_ok 8 2 --model-config "$D" --train tp=2,pp=2 --infer tp=2,dp=2 $BOTH
  perf_ok 4 2 --model-config "$D" --train tp=2,pp=2 --infer tp=4 --colocate --staging 16K $BOTH
  perf_ok 6 2 --model-config "$M" --train tp=2,ep=2,etp=1 --infer tp=2,dp=2,ep=4 $BOTH
  perf_ok 4 1 --model-config "$M" --train tp=1,pp=2,dp=2,ep=2 --infer tp=1,pp=2,dp=2,ep=2 --colocate --staging 8K --baseline broadcast
  perf_ok 8 0 --model-config "$repo/tests/data/tiny-deepseek-v3-fp8.json" --per-expert --block-scales --train tp=2,dp=2,ep=2,etp=2 --infer tp=2,dp=2,ep=4
  # bf16 training -> fp8 inference, quantized on the way (-c 1: every code and scale)
  perf_ok 8 0 --model-config "$repo/tests/data/tiny-deepseek-v3-fp8.json" --infer-dtype fp8e4m3 --train tp=2,dp=2,ep=2,etp=2 --infer tp=2,dp=2,ep=4
  perf_ok 2 0 --model-config "$repo/tests/data/tiny-llama.json" --infer-dtype fp8e4m3 --block 8,16 --train tp=2 --infer tp=2 --colocate
  export RESHARD_PERF_HVECTOR=1
  perf_ok 6 1 --model-config "$M" --train tp=2,ep=2,etp=1 --infer tp=2,dp=2,ep=4 --baseline alltoallw
  unset RESHARD_PERF_HVECTOR
  ;;
*)
  echo "unknown case '$case_name'"
  exit 2
  ;;
esac

if [[ $failures -ne 0 ]]; then
  echo "$case_name: $failures failure(s)"
  exit 1
fi
echo "$case_name: passed"
