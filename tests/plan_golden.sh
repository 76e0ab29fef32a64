#!/usr/bin/env bash
# reshard_plan's printed figures, compared with those of an earlier
# version of the tool (issue 21: the dry run was made faster by doing each
# piece of work once; what it prints must not change).
#
#   tests/plan_golden.sh PLAN              compare every scenario
#   tests/plan_golden.sh PLAN --update     rewrite the golden files
#
# The scenarios are tests/data/plan_golden/scenarios.txt; each golden file
# holds the tool's output with what varies from run to run taken out: the
# per-rank planning time, CPU time and peak memory (the columns plan_ms,
# cpu_ms and peak_MiB, and their worst values on the last line) and the
# line that says how they were measured; the repository's path reads $R.
# Everything else must match byte for byte: each rank's plan digest (a
# hash of all its messages and copies, --digest), the plans' traffic per
# rank, the agreed chunk, spread and phases, the coverage checks, the
# predicted times, T_lower and the baselines. The golden files were made
# by the tool before issue 21 (patched only to print the digests).
# --update is for a change that is meant to change the plans;
# say so in its commit.
set -uo pipefail

plan=$1
update=${2:-}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$repo/tests/data/plan_golden
[[ -x $plan ]] || { echo "plan_golden.sh: $plan is not executable" >&2; exit 2; }

# The figures of a run, without what is measured rather than computed.
normalize() {
  awk -v repo="$repo" '
    { i = index($0, repo); if (i) $0 = substr($0, 1, i - 1) "$R" substr($0, i + length(repo)) }
    /^# per rank: plan_ms/ || /^# timed: / { skip = 1; next }
    skip && /^# (traffic|timing)/ { skip = 0 }
    skip { next }
    $1 ~ /^[0-9]+$/ && NF == 14 && ($2 == "src" || $2 == "dst" || $2 == "both" || $2 == "none") {
      $3 = "-"; $4 = "-"; $5 = "-"; print; next
    }
    /^# reshard_plan: ranks=/ {
      sub(/plan_ms=[^ ]+/, "plan_ms=-"); sub(/peak_MiB=[^ ]+/, "peak_MiB=-"); print; next
    }
    { print }
  '
}

failures=0
n=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
while IFS='|' read -r name args; do
  [[ -z $name || $name == \#* ]] && continue
  n=$((n + 1))
  args=${args//\$R/$repo}
  # shellcheck disable=SC2086
  if ! "$plan" $args --digest >"$out" 2>&1; then
    echo "FAIL: $name: reshard_plan exited non-zero"
    tail -n 20 "$out"
    failures=$((failures + 1))
    continue
  fi
  if [[ $update == --update ]]; then
    normalize <"$out" >"$dir/$name.txt"
    echo "updated $name"
    continue
  fi
  if ! diff -u "$dir/$name.txt" <(normalize <"$out") >"$out.diff"; then
    echo "FAIL: $name: the output differs from $dir/$name.txt:"
    head -n 40 "$out.diff"
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
  rm -f "$out.diff"
done <"$dir/scenarios.txt"
[[ $n -gt 0 ]] || { echo "FAIL: no scenarios in $dir/scenarios.txt"; exit 1; }
if ((failures)); then
  echo "plan_golden.sh: $failures of $n scenarios differ"
  exit 1
fi
echo "plan_golden.sh: all $n scenarios match"
