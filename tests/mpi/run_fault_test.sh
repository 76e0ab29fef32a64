#!/usr/bin/env bash
# Runs one MPI fault test (tests/mpi/test_mpi_faults.c, test_mpi_attack.c)
# and judges it by its per-rank report lines rather than by mpirun alone,
# since a test in which a rank dies cannot end with a clean MPI_Finalize.
#
#   run_fault_test.sh LIMIT_S PASSES ZERO_EXIT [STATES] -- MPIRUN_COMMAND...
#
# Passes when the command finished within LIMIT_S seconds (`timeout`: a
# hang fails), printed exactly PASSES lines starting with "PASS rank", no
# line starting with "FAIL", and, when ZERO_EXIT is 1, exited 0.
#
# With STATES, the command must also print exactly STATES lines (see
# tests/mpi/state_line.h)
#   STATE <label> rank R committed V active C doubt D whole W
# and the ranks of each label agree: every W is 1 (the copy holding the
# committed version holds it whole); each rank reports once; the ranks
# with nothing in doubt (D 0) are at one committed version, and a rank
# with a version in doubt is at that version or has it in doubt (without
# such ranks, the first rank's committed version is the reference).
set -uo pipefail

states=""
if [ $# -ge 6 ] && [ "$4" != "--" ] && [ "$5" = "--" ]; then
  states=$4
  set -- "$1" "$2" "$3" "${@:5}"
fi
if [ $# -lt 5 ] || [ "$4" != "--" ]; then
  echo "usage: $0 LIMIT_S PASSES ZERO_EXIT [STATES] -- command..." >&2
  exit 2
fi
limit=$1 passes=$2 zero_exit=$3
shift 4

out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$SECONDS
timeout --kill-after=5 "$limit" "$@" >"$out" 2>&1
rc=$?
elapsed=$((SECONDS - start))
cat "$out"

fail=0
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "run_fault_test: FAIL: not finished after ${limit} s (hang)"
  fail=1
fi
got=$(grep -c '^PASS rank' "$out")
if [ "$got" -ne "$passes" ]; then
  echo "run_fault_test: FAIL: $got PASS lines, expected $passes"
  fail=1
fi
if grep -q '^FAIL' "$out"; then
  echo "run_fault_test: FAIL: a rank reported a failure"
  fail=1
fi
if [ "$zero_exit" = 1 ] && [ "$rc" -ne 0 ]; then
  echo "run_fault_test: FAIL: exit status $rc, expected 0"
  fail=1
fi
if [ -n "$states" ]; then
  # fields: $2 label, $4 rank, $6 committed, $8 active, $10 doubt, $12 whole
  if ! awk -v want="$states" '
    function bad(why) { print "run_fault_test: FAIL: " why; failed = 1 }
    /^STATE / {
      n++
      if (NF != 12 || $3 != "rank" || $5 != "committed" || $7 != "active" || $9 != "doubt" || $11 != "whole") {
        bad("malformed: " $0); next
      }
      l = $2; key = l SUBSEP $4
      if (key in seen) bad("label " l ": rank " $4 " reported twice")
      seen[key] = 1
      if ($12 != 1) bad("label " l ": rank " $4 " holds committed version " $6 " not whole in copy " $8)
      labels[l] = 1; cnt[l]++; rk[l, cnt[l]] = $4; cv[l, cnt[l]] = $6; dv[l, cnt[l]] = $10
    }
    END {
      if (n + 0 != want + 0) bad(n + 0 " STATE lines, expected " want)
      for (l in labels) {
        ref = cv[l, 1] # the committed version of the ranks with nothing in doubt
        for (i = cnt[l]; i >= 1; i--) if (dv[l, i] == 0) ref = cv[l, i]
        for (i = 1; i <= cnt[l]; i++) {
          if (dv[l, i] == 0 && cv[l, i] != ref)
            bad("label " l ": rank " rk[l, i] " committed " cv[l, i] ", another rank " ref)
          if (dv[l, i] != 0 && cv[l, i] != ref && dv[l, i] != ref)
            bad("label " l ": rank " rk[l, i] " committed " cv[l, i] " with " dv[l, i] " in doubt, the others " ref)
        }
      }
      exit failed
    }' "$out"; then
    fail=1
  fi
fi
echo "run_fault_test: exit status $rc after ${elapsed} s, $got PASS lines${states:+, STATE lines judged (expected $states)}"
exit "$fail"
