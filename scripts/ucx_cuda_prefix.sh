#!/usr/bin/env bash
# A CUDA-enabled UCX for GPU memory over UCX (reshard_comm_create_ucx_cuda),
# from PyPI's libucx-cu13 wheel (Debian's libucx is built without CUDA), laid
# out as an install prefix that CMake's pkg-config finds and the loader uses:
#   DIR/include              UCX's headers
#   DIR/lib/lib*.so.0        libucp, libuct, libucs, libucm (+ lib*.so links)
#   DIR/lib/ucx/             the cuda and cma transport modules
#   DIR/lib/libcudart-*.so*  the CUDA runtime the cuda memory hooks link
#   DIR/lib/pkgconfig/ucx.pc
# Run it where PyPI is reachable, then carry DIR to the GPU machine
# (scripts/gpu_check.sh uses build-ucx-cu13/ when it exists):
#   scripts/ucx_cuda_prefix.sh [DIR]          (default: build-ucx-cu13)
# Build with PKG_CONFIG_PATH=DIR/lib/pkgconfig and run with
# LD_LIBRARY_PATH=DIR/lib. About 20 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-ucx-cu13}
WHEEL_SPEC=${RESHARD_UCX_WHEEL:-libucx-cu13}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet -d "$tmp" "$WHEEL_SPEC"
whl=$(ls "$tmp"/libucx_cu*.whl | head -n 1)
python3 -m zipfile -e "$whl" "$tmp/x"
src=$tmp/x/libucx
[ -e "$src/lib/libucp.so.0" ] || { echo "ucx_cuda_prefix: $whl has no libucx/lib/libucp.so.0" >&2; exit 1; }
rm -rf "$DIR"
mkdir -p "$DIR/lib/ucx" "$DIR/lib/pkgconfig"
cp -r "$src/include" "$DIR/"
for l in ucp uct ucs ucm; do
  cp "$src/lib/lib$l.so.0" "$DIR/lib/"
  ln -s "lib$l.so.0" "$DIR/lib/lib$l.so"
done
# the modules UCX loads from lib/ucx/ next to libucs (the perftest one is
# not needed); the wheel's zip holds copies, not links
for m in "$src"/lib/ucx/libuct_*.so.0 "$src"/lib/ucx/libucm_*.so.0; do cp "$m" "$DIR/lib/ucx/"; done
cp "$tmp"/x/libucx_cu*.libs/libcudart-*.so* "$DIR/lib/" 2>/dev/null || true
version=$(sed -n 's/^Version: *//p' "$src/lib/pkgconfig/ucx.pc")
cat >"$DIR/lib/pkgconfig/ucx.pc" <<EOF
# written by scripts/ucx_cuda_prefix.sh from $(basename "$whl")
# (relative to this file: the prefix may move to another machine)
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: ucx
Description: Unified Communication X (CUDA-enabled, from the $WHEEL_SPEC wheel)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lucp -luct -lucs -lucm
EOF
echo "ucx_cuda_prefix: UCX $version with CUDA in $DIR ($(du -sh "$DIR" | cut -f1))"
