#!/usr/bin/env bash
# A rank of an MPI program stops (SIGSTOP) in the middle of its work: the
# others must end the job, non-zero, within reshard's deadline + 10 s,
# never hang (issue 17, item 8: the tools and examples).
#
#   stopped_rank.sh MARKER -- MPIRUN_COMMAND...
#
# Runs the command with RESHARD_TIMEOUT_MS=2000, waits until its output
# shows MARKER (the program is in its main loop) and one more second,
# stops the last rank process mpirun started, then waits. Passes when
# mpirun exits non-zero within 12 s of the stop; a run still going after
# 60 s is a hang and fails. Every process is killed at the end.
set -uo pipefail

if [ $# -lt 3 ] || [ "$2" != "--" ]; then
  echo "usage: $0 MARKER -- command..." >&2
  exit 2
fi
marker=$1
shift 2

export RESHARD_TIMEOUT_MS=2000
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp)
# (processes named by PID and start time: a PID freed by one that ended
# may belong to another test's process by the time of the cleanup)
# shellcheck source=../support/procs.sh
source "$(dirname "$0")/../support/procs.sh"
"$@" >"$out" 2>&1 &
job=$!
jobid=$(rs_proc_id "$job")
victim="" victimid=""
cleanup() {
  rs_kill_tree "$victimid"
  rs_kill_tree "$jobid"
  rm -f "$out"
}
trap cleanup EXIT

fail() {
  echo "stopped_rank: FAIL: $*"
  echo "---- output"; tail -n 40 "$out"
  exit 1
}

# the program reaches its main loop
for _ in $(seq 1 600); do
  grep -q -- "$marker" "$out" && break
  rs_alive "$jobid" || fail "the program ended before its main loop"
  sleep 0.1
done
grep -q -- "$marker" "$out" || fail "no '$marker' in the output after 60 s"
sleep 1
victim=$(pgrep -P "$job" | sort -n | tail -n 1)
[ -n "$victim" ] || fail "no rank process under mpirun (pid $job)"
victimid=$(rs_proc_id "$victim")
kill -STOP "$victim"
stopped=$SECONDS
echo "stopped_rank: stopped process $victim at $(date +%T)"

for _ in $(seq 1 600); do
  rs_alive "$jobid" || break
  sleep 0.1
done
if rs_alive "$jobid"; then
  fail "mpirun still running 60 s after a rank stopped (a hang)"
fi
wait "$job"
rc=$?
elapsed=$((SECONDS - stopped))
tail -n 15 "$out"
[ "$rc" -ne 0 ] || fail "mpirun exited 0 with a rank stopped"
[ "$elapsed" -le 12 ] || fail "mpirun ended ${elapsed} s after the stop (deadline 2 s + 10 s)"
echo "stopped_rank: PASS: mpirun exited $rc, ${elapsed} s after the stop"
exit 0
