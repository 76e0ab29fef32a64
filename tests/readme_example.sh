#!/usr/bin/env bash
# The README's C example, as a reader would use it: the first ```c block
# of README.md, compiled with the MPI compiler against this build's
# libreshard.so and the public headers only, then run on 8 MPI ranks. It
# must build without warnings and run without a failed call (the sketch
# prints "rank R: <error>" on stderr for each) within the time limit.
#
#   tests/readme_example.sh SOURCE_DIR LIBRARY_DIR MPICC MPIEXEC
set -euo pipefail
src=$1 lib=$2 mpicc=$3 mpiexec=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk '/^```c$/ { inside = 1; next } /^```$/ { if (inside) exit } inside' "$src/README.md" >"$work/example.c"
[[ -s $work/example.c ]] || { echo "readme_example.sh: no \`\`\`c block in README.md" >&2; exit 1; }
grep -q 'reshard_plan_create' "$work/example.c" || { echo "readme_example.sh: the C block plans nothing" >&2; exit 1; }
"$mpicc" -std=c11 -Wall -Wextra -Werror -I"$src/include" "$work/example.c" -o "$work/example" \
  -L"$lib" -lreshard -Wl,-rpath,"$lib"
# the plan's own deadlines end a stuck run; timeout is the outer guard
timeout 120 "$mpiexec" -np 8 --oversubscribe "$work/example" >"$work/out" 2>"$work/err" || {
  echo "readme_example.sh: the example failed (exit $?)" >&2; cat "$work/out" "$work/err" >&2; exit 1; }
if grep -E '^rank [0-9]+: ' "$work/err" >&2; then
  echo "readme_example.sh: a call of the example failed (above)" >&2
  exit 1
fi
echo "readme_example.sh: README's C example built and ran on 8 ranks"
