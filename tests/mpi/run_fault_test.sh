#!/usr/bin/env bash
# Runs one MPI fault test (tests/mpi/test_mpi_faults.c) and judges it by
# its per-rank report lines rather than by mpirun alone, since a test in
# which a rank dies cannot end with a clean MPI_Finalize.
#
#   run_fault_test.sh LIMIT_S PASSES ZERO_EXIT -- MPIRUN_COMMAND...
#
# Passes when the command finished within LIMIT_S seconds (`timeout`: a
# hang fails), printed exactly PASSES lines starting with "PASS rank", no
# line starting with "FAIL", and, when ZERO_EXIT is 1, exited 0.
set -uo pipefail

if [ $# -lt 5 ] || [ "$4" != "--" ]; then
  echo "usage: $0 LIMIT_S PASSES ZERO_EXIT -- command..." >&2
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
echo "run_fault_test: exit status $rc after ${elapsed} s, $got PASS lines"
exit "$fail"
