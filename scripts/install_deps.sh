#!/usr/bin/env bash
# Installs the packages needed to build and test reshard on Debian/Ubuntu,
# skipping apt entirely when they are all present (fast reruns, and no root
# needed on an already provisioned machine). Shared by scripts/test.sh and
# .ci/run so both always agree on the list.
#
#   install_deps.sh        what building and testing need
#   install_deps.sh --ci   also CI's checkers: clang with libFuzzer (the
#                          plan fuzzer; Debian's clang only recommends
#                          libclang-rt-14-dev, which holds libFuzzer, and
#                          recommends are not installed), valgrind and
#                          SimGrid (scripts/simulate.sh --smoke)
set -euo pipefail

# patch: the real-verl test applies reshard's verl patch with it.
# libucx-dev: the UCX transport (processes launched without MPI).
# python3-venv and python3-dev: the Python package (scripts/test_python.sh
# builds it in a virtual environment with pip).
RESHARD_DEPS=(build-essential cmake pkg-config libcmocka-dev libopenmpi-dev openmpi-bin libjansson-dev procps patch
  python3-venv python3-dev libucx-dev)
if [ "${1:-}" = "--ci" ]; then
  RESHARD_DEPS+=(clang libclang-rt-14-dev valgrind libsimgrid-dev)
fi

missing=()
for pkg in "${RESHARD_DEPS[@]}"; do
  # dpkg -s also succeeds for removed-but-configured packages; only an
  # "install ok installed" status means the files are really there.
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null |
      grep -q '^install ok installed$'; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all present (${RESHARD_DEPS[*]})"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "install_deps: missing ${missing[*]} and not root (no sudo);" \
         "install them by hand" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
