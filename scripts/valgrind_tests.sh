#!/usr/bin/env bash
# Runs every unit test of a build under valgrind's memcheck: any invalid
# access, use of uninitialised memory or definite leak fails it.
#
#   bash scripts/valgrind_tests.sh BUILD_DIR
#
# BUILD_DIR must be a build without sanitizers (valgrind cannot run them):
#   cmake -S . -B build-vg -DCMAKE_BUILD_TYPE=RelWithDebInfo \
#     -DRESHARD_WITH_CUDA=OFF -DRESHARD_WITH_MPI=OFF
# The unit tests are the CMocka executables (tests/unit/test_*.c, tests/system/test_*.c) and the fuzz
# corpus replay. Valgrind runs them 20-50x slower, so the heavy property
# tests and the replay run with RESHARD_TEST_SCALE (default here 0.1: a
# tenth of their seeds or inputs; tests/support/test_scale.h), which they
# honour without skipping a test. Prints each test's time; exits non-zero
# if any test failed.
set -uo pipefail

build=${1:?usage: valgrind_tests.sh BUILD_DIR}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export RESHARD_TEST_SCALE=${RESHARD_TEST_SCALE:-0.1}

vg=(valgrind --quiet --error-exitcode=1 --leak-check=full
    --errors-for-leak-kinds=definite --track-origins=no)

tests=()
for exe in "$build"/tests/test_*; do
  [ -f "$exe" ] && [ -x "$exe" ] && tests+=("$exe")
done
if [ ${#tests[@]} -eq 0 ]; then
  echo "valgrind_tests: no test executables under $build/tests" >&2
  exit 1
fi

failed=()
total_start=$SECONDS
run() {
  local name=$1
  shift
  local start=$SECONDS
  if "${vg[@]}" "$@" >"$build/valgrind-$name.log" 2>&1; then
    printf 'valgrind %-24s passed in %4d s\n' "$name" $((SECONDS - start))
  else
    printf 'valgrind %-24s FAILED in %4d s (log below)\n' "$name" $((SECONDS - start))
    tail -n 60 "$build/valgrind-$name.log"
    failed+=("$name")
  fi
}
for exe in "${tests[@]}"; do
  run "$(basename "$exe")" "$exe"
done
if [ -x "$build/tests/replay_corpus" ]; then
  run replay_corpus "$build/tests/replay_corpus" "$src/tests/fuzz/corpus"
fi

echo "valgrind_tests: ${#tests[@]} + 1 tests in $((SECONDS - total_start)) s" \
     "(RESHARD_TEST_SCALE=$RESHARD_TEST_SCALE)"
if [ ${#failed[@]} -ne 0 ]; then
  echo "valgrind_tests: FAILED: ${failed[*]}"
  exit 1
fi
