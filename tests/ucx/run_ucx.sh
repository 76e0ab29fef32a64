#!/usr/bin/env bash
# Launches a program as NPROCS plain processes (no mpirun) that make a
# communicator over UCX (reshard_comm_create_ucx) at a rendezvous on a free
# TCP port of 127.0.0.1:
#
#   run_ucx.sh LIMIT_S NPROCS -- PROGRAM ARGS...
#
# runs, for R = 0 .. NPROCS-1, in the background,
#
#   PROGRAM --rendezvous 127.0.0.1:PORT --rank R --size NPROCS ARGS...
#
# (ARGS may override --size, e.g. to start fewer processes than the world
# holds), each with its stdout and stderr in a file of its own. Waits for
# all of them, for LIMIT_S seconds at most: then every process still
# running is killed (SIGCONT, SIGKILL: a stopped one too) and the run
# fails (a hang). Afterwards prints each rank's output, in rank order,
# unprefixed, after a "---- rank R: ..." line (so that
# tests/mpi/run_fault_test.sh can count its PASS, FAIL and STATE lines:
# this script can be its command), and exits 0 when every process exited
# 0, 124 after a timeout, else 1. No process is left behind: on any exit
# (a signal from ctest or `timeout` included) the children still running
# are killed, and only they: each is named by its PID and start time
# (tests/support/procs.sh), since a PID freed by a child that ended may
# already belong to another test's process.
set -uo pipefail
# shellcheck source=../support/procs.sh
source "$(dirname "$0")/../support/procs.sh"

if [ $# -lt 4 ] || [ "$3" != "--" ]; then
  echo "usage: $0 LIMIT_S NPROCS -- PROGRAM ARGS..." >&2
  exit 2
fi
limit=$1 nprocs=$2
shift 3
case "$limit$nprocs" in *[!0-9]*) echo "$0: LIMIT_S and NPROCS are numbers" >&2; exit 2 ;; esac
[ "$nprocs" -ge 1 ] || { echo "$0: NPROCS >= 1" >&2; exit 2; }

# UCX: no setting is needed. Its defaults (UCX_TLS all) pick shared memory
# between the processes and TCP on the loopback, and the rendezvous (a
# ucp_listener) connects over TCP; UCX_TLS=tcp,self works as well, but a
# UCX_TLS without tcp (sm,self) cannot make the client-server connection
# of the rendezvous (comm_create_ucx times out). The caller's UCX_* pass
# through unchanged.

dir=$(mktemp -d "${TMPDIR:-/tmp}/run_ucx.XXXXXX") || exit 1
pids=() ids=()

kill_all() {
  local id
  for id in "${ids[@]}"; do rs_kill_tree "$id"; done # (each with its children)
}
cleanup() {
  exec 2>/dev/null
  kill_all
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# A free port below the ephemeral range (tests/support/free_port.py says
# why), else, without python3, a random one there.
port=$(python3 "$(dirname "$0")/../support/free_port.py" 2>/dev/null)
if [ -z "$port" ]; then
  port=$((10000 + RANDOM % 22000))
fi
addr=127.0.0.1:$port

# milliseconds of the wall clock (bash 5's EPOCHREALTIME, else date)
now_ms() {
  if [ -n "${EPOCHREALTIME:-}" ]; then
    local t=${EPOCHREALTIME/[.,]/}
    echo $((10#$t / 1000))
  else
    date +%s%3N
  fi
}

start=$(now_ms)
for ((r = 0; r < nprocs; r++)); do
  "$1" --rendezvous "$addr" --rank "$r" --size "$nprocs" "${@:2}" >"$dir/rank$r.log" 2>&1 </dev/null &
  pids+=($!)
  ids+=("$(rs_proc_id $!)") # (empty when it ended already)
done

# Wait for every process until the limit (bash reaps them as they end:
# rs_alive fails once one is gone, and `wait` then gives its status).
timed_out=0
deadline=$((start + limit * 1000))
while :; do
  alive=0
  for id in "${ids[@]}"; do
    if rs_alive "$id"; then alive=1; break; fi
  done
  [ "$alive" = 0 ] && break
  if [ "$(now_ms)" -ge "$deadline" ]; then
    timed_out=1
    break
  fi
  sleep 0.1
done
if [ "$timed_out" = 1 ]; then
  still=()
  for ((r = 0; r < nprocs; r++)); do
    rs_alive "${ids[$r]}" && still+=("$r")
  done
  exec 3>&2 2>/dev/null # no "Killed" notices from bash: the line below says it
  kill_all
fi

rc=0
for ((r = 0; r < nprocs; r++)); do
  wait "${pids[$r]}" 2>/dev/null
  st=$?
  echo "---- rank $r: exit status $st"
  cat "$dir/rank$r.log"
  [ "$st" -ne 0 ] && rc=1
done
elapsed=$(( ($(now_ms) - start) / 100 ))
elapsed=$((elapsed / 10)).$((elapsed % 10))
if [ "$timed_out" = 1 ]; then
  exec 2>&3 3>&-
  echo "run_ucx: TIMEOUT: ranks ${still[*]} still running after ${limit} s: killed"
  exit 124
fi
echo "run_ucx: $nprocs processes on $addr, $( [ $rc = 0 ] && echo 'all exited 0' || echo 'some failed'), ${elapsed} s"
exit $rc
