# Processes named safely by the test launchers (tests/ucx/run_ucx.sh,
# tests/mpi/stopped_rank.sh), which source this file. A PID names a
# process only while it lives: the kernel hands a freed PID to the next
# process once the PIDs wrap (pid_max is 32768 on many machines), so a
# launcher that kills its children's PIDs after they ended could kill
# another process. Here a process
# is named by its PID and start time (field 22 of /proc/PID/stat), and is
# only called alive, or killed, while both still match.

# rs_proc_id PID: "PID:STARTTIME", or nothing when no such process lives.
rs_proc_id() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  s=${s##*) } # the fields after "(comm) ", which may hold spaces
  local -a f
  read -r -a f <<<"$s"
  [ "${#f[@]}" -ge 20 ] && echo "$1:${f[19]}"
}

# rs_alive ID: whether the process ID (rs_proc_id's) still lives.
rs_alive() {
  [ -n "$1" ] && [ "$(rs_proc_id "${1%%:*}")" = "$1" ]
}

# rs_kill_tree ID: SIGCONT then SIGKILL to the process ID and to its
# children of the moment (a stopped one too), if it is still that process.
rs_kill_tree() {
  local p=${1%%:*} c
  rs_alive "$1" || return 0
  for c in $(pgrep -P "$p" 2>/dev/null); do
    kill -CONT "$c" 2>/dev/null
    kill -KILL "$c" 2>/dev/null
  done
  rs_alive "$1" || return 0
  kill -CONT "$p" 2>/dev/null
  kill -KILL "$p" 2>/dev/null
}
