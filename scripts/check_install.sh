#!/usr/bin/env bash
# Checks that an installed reshard is usable by other projects: installs the
# build tree into a scratch prefix, then builds and runs a tiny consumer
# twice, once through find_package(reshard) and once through pkg-config.
#
# usage: scripts/check_install.sh [BUILD_DIR]   (default: build)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir=${1:-build}
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  echo "check_install: $build_dir is not a configured build tree" >&2
  exit 1
fi

prefix=$(mktemp -d /tmp/reshard-install-XXXX)
work=$(mktemp -d /tmp/reshard-consumer-XXXX)
cleanup() { [ -n "${KEEP_WORK:-}" ] || rm -rf "$prefix" "$work"; }
trap cleanup EXIT

fail() { echo "check_install: FAIL: $*" >&2; exit 1; }

echo "check_install: installing $build_dir into $prefix"
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log"; fail "cmake --install"; }
sed 's/^/  /' "$work/install.log"

# --- what was installed ------------------------------------------------
[ -f "$prefix/include/reshard.h" ] || fail "include/reshard.h not installed"
[ -f "$prefix/include/reshard_inproc.h" ] || fail "include/reshard_inproc.h not installed"
pc=$(find "$prefix" -name reshard.pc -print -quit)
[ -n "$pc" ] || fail "reshard.pc not installed"
libdir=$(dirname "$(dirname "$pc")")
cfg=$(find "$prefix" -name reshard-config.cmake -print -quit)
[ -n "$cfg" ] || fail "reshard-config.cmake not installed"
[ -f "$(dirname "$cfg")/reshard-config-version.cmake" ] ||
  fail "reshard-config-version.cmake not installed"
[ -L "$libdir/libreshard.so" ] || fail "no libreshard.so link in $libdir"
soname=$(readelf -d "$libdir/libreshard.so" |
         sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] || fail "libreshard.so has no SONAME"
[ -e "$libdir/$soname" ] || fail "SONAME $soname not installed in $libdir"
echo "check_install: SONAME $soname"
# The library boundary (src/reshard.map): only the public API, reshard_*,
# leaves libreshard.so, plus the internals marked RESHARD_PRIVATE for
# libreshard_models.so. (readelf names a symbol NAME@@VERSION where the
# binutils show versions, NAME where they do not: both are accepted.)
defined() { readelf --dyn-syms -W "$@" | awk '$7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") {print $8}' | sort -u; }
leaked=$(defined "$libdir/libreshard.so" |
         grep -v -E '^(reshard_[A-Za-z0-9_]+(@@RESHARD_0)?|RESHARD_0|RESHARD_PRIVATE)$' |
         grep -v -E '^rs_(error|error_clear|breadcrumb|layout_buffer_on_rank|layout_rank_meshes)(@@RESHARD_PRIVATE)?$' || true)
[ -z "$leaked" ] || fail "libreshard.so exports internals: $(echo $leaked | head -c 400)"
public=$(defined "$libdir/libreshard.so" | grep -c '^reshard_' || true)
echo "check_install: libreshard.so exports $public reshard_* symbols and the 5 private ones, nothing else"
# and every function the installed headers declare is exported, but the
# static inline helpers (reshard_shard, ...): a C parse of the headers'
# declarations (up to each ';' or '{'), not a line grep
exported=$(defined "$libdir"/libreshard*.so | sed 's/@.*//')
missing=$(python3 - "$prefix"/include/reshard*.h <<'PY' | comm -23 - <(echo "$exported")
import re, sys
names = set()
for path in sys.argv[1:]:
    text = re.sub(r"/\*.*?\*/", " ", open(path).read(), flags=re.S)
    text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)
    for decl in re.split(r"[;{}]", text):
        m = re.search(r"\b(reshard_[a-z0-9_]+)\s*\(", decl)
        if m and "static" not in decl.split(m.group(1))[0] and "typedef" not in decl:
            names.add(m.group(1))
print("\n".join(sorted(names)))
PY
)
[ -z "$missing" ] || fail "declared in the installed headers, not exported: $missing"
# Tests and the core's static library are build-tree only; the model
# front-end is installed both ways.
stray=$(find "$prefix" \( -name 'test_*' -o \( -name '*.a' ! -name libreshard_models.a \) \
                         -o -name '*reshard_static*' \) -print)
[ -z "$stray" ] || fail "installed files that should not be: $stray"
[ -f "$prefix/include/reshard_models.h" ] || fail "include/reshard_models.h not installed"
[ -f "$prefix/include/reshard_selftest.h" ] || fail "include/reshard_selftest.h not installed"
[ -f "$libdir/libreshard_models.a" ] || fail "libreshard_models.a not installed"
[ -L "$libdir/libreshard_models.so" ] || fail "no libreshard_models.so link in $libdir"
[ -f "$libdir/pkgconfig/reshard_models.pc" ] || fail "reshard_models.pc not installed"

# --- the consumer ------------------------------------------------------
mkdir -p "$work/src"
cat >"$work/src/main.c" <<'C'
#include <reshard.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const int v = reshard_version();
  const char *s = reshard_result_string(RESHARD_SUCCESS);
  printf("consumer: reshard_version() = %d, RESHARD_VERSION = %d, "
         "reshard_result_string(RESHARD_SUCCESS) = \"%s\"\n",
         v, RESHARD_VERSION, s ? s : "(null)");
  /* The header and the library must come from the same install. */
  if (v != RESHARD_VERSION || s == NULL || strlen(s) == 0)
    return 1;
  return 0;
}
C
# The model front-end: a config, both frameworks' layouts, a parameter
# looked up by (rank, name) and back, what vLLM rewrites after loading.
cat >"$work/src/models.c" <<'C'
#include <reshard_models.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call) do { reshard_result_t r_ = (call); if (r_) { \
  fprintf(stderr, "%s: %s\\n", #call, reshard_last_error()); return 1; } } while (0)

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  rm_model *m = NULL;
  rm_parallel t = RM_PARALLEL_INIT, v = RM_PARALLEL_INIT;
  reshard_layout_t *src = NULL, *dst = NULL;
  CHECK(rm_model_load(argv[1], 0, RESHARD_BF16, &m));
  CHECK(rm_parse_parallel("tp=2,pp=2", &t));
  CHECK(rm_parse_parallel("tp=2,dp=2", &v));
  CHECK(rm_megatron_layout(m, &t, 0, &src));
  CHECK(rm_vllm_layout(m, &v, 4, &dst));
  int b = -1;
  const char *name = NULL;
  /* stage 1 (ranks 2, 3) numbers its layers from 0 */
  CHECK(reshard_layout_find_buffer(src, "decoder.layers.0.self_attention.linear_qkv.weight", 3, &b));
  CHECK(rm_parameter_name(src, b, 3, &name));
  CHECK(reshard_layout_find_buffer(dst, "model.layers.3.self_attn.qkv_proj.weight", 7, &b));
  const char *why = rm_after_load(m, RM_FRAMEWORK_VLLM, dst, b);
  printf("models consumer: %s, %d tensors, %s on rank 3; after load: %s\n", rm_model_arch(m),
         rm_model_num_tensors(m), name, why ? why : "nothing");
  int ok = !strcmp(name, "decoder.layers.0.self_attention.linear_qkv.weight") && !why;
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  rm_model_free(m);
  return ok ? 0 : 1;
}
C
config="$PWD/tests/data/tiny-llama.json"

cat >"$work/src/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.24)
project(reshard_consumer LANGUAGES C)
find_package(reshard 0.1 REQUIRED CONFIG)
foreach(t reshard::reshard reshard::reshard_models reshard::reshard_models_static)
  if(NOT TARGET ${t})
    message(FATAL_ERROR "find_package(reshard) gave no ${t}")
  endif()
endforeach()
message(STATUS "consumer: reshard ${reshard_VERSION} from ${reshard_DIR}")
add_executable(consumer main.c)
target_compile_options(consumer PRIVATE -Wall -Wextra -Werror)
target_link_libraries(consumer PRIVATE reshard::reshard)
add_executable(models models.c)
target_compile_options(models PRIVATE -Wall -Wextra -Werror)
target_link_libraries(models PRIVATE reshard::reshard_models)
add_executable(models_static models.c)
target_compile_options(models_static PRIVATE -Wall -Wextra -Werror)
target_link_libraries(models_static PRIVATE reshard::reshard_models_static)
CM

export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

check_links_to_prefix() {
  local lib
  lib=$(ldd "$1" | awk '/libreshard\.so/ {print $3}')
  case "$lib" in
    "$libdir"/*) ;;
    *) fail "$1 resolves libreshard to '$lib', not to $libdir" ;;
  esac
}

echo "check_install: consumer via find_package(reshard)"
# Only the scratch prefix may satisfy find_package: the package registry
# and system prefixes could hide a broken install behind an older one.
cmake -S "$work/src" -B "$work/build-cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF >"$work/cmake.log" ||
  { cat "$work/cmake.log"; fail "consumer configure (find_package)"; }
grep 'consumer:' "$work/cmake.log" | sed 's/^--/ /'
cmake --build "$work/build-cmake" >"$work/build.log" ||
  { cat "$work/build.log"; fail "consumer build (find_package)"; }
check_links_to_prefix "$work/build-cmake/consumer"
"$work/build-cmake/consumer" || fail "consumer (find_package) failed"
check_links_to_prefix "$work/build-cmake/models"
libs=$(ldd "$work/build-cmake/models") # not piped into grep -q: pipefail sees ldd's SIGPIPE
grep -q "$libdir/libreshard_models.so" <<<"$libs" ||
  fail "models consumer does not load $libdir/libreshard_models.so"
"$work/build-cmake/models" "$config" || fail "models consumer (find_package, shared) failed"
libs=$(ldd "$work/build-cmake/models_static")
grep -q libreshard_models.so <<<"$libs" && fail "models_static consumer loads libreshard_models.so"
"$work/build-cmake/models_static" "$config" || fail "models consumer (find_package, static) failed"

echo "check_install: consumer via pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs reshard) || fail "pkg-config reshard"
echo "  pkg-config --cflags --libs reshard: $flags"
[ "$(pkg-config --modversion reshard)" = "$(sed -n \
  's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' \
  "$(dirname "$cfg")/reshard-config-version.cmake")" ] ||
  fail "pkg-config and CMake package disagree on the version"
static_libs=$(pkg-config --static --libs reshard)
grep -q -- '-lpthread' <<<"$static_libs" ||
  fail "pkg-config --static lacks -lpthread"
# shellcheck disable=SC2086 # flags are meant to split
cc -std=c11 -Wall -Wextra -Werror "$work/src/main.c" -o "$work/consumer-pc" \
  $flags || fail "consumer build (pkg-config)"
check_links_to_prefix "$work/consumer-pc"
"$work/consumer-pc" || fail "consumer (pkg-config) failed"
mflags=$(pkg-config --cflags --libs reshard_models) || fail "pkg-config reshard_models"
echo "  pkg-config --cflags --libs reshard_models: $mflags"
# shellcheck disable=SC2086 # flags are meant to split
cc -std=c11 -Wall -Wextra -Werror "$work/src/models.c" -o "$work/models-pc" $mflags ||
  fail "models consumer build (pkg-config)"
"$work/models-pc" "$config" || fail "models consumer (pkg-config) failed"

# The installed MPI example, built out of the tree as docs/API.md's "Use
# reshard from your own project" says (mpicc + pkg-config + rpath), and run
# as a real weight sync on 8 ranks from the installed configs.
if [ -f "$prefix/include/reshard_mpi.h" ] && command -v mpicc >/dev/null 2>&1 &&
   command -v mpirun >/dev/null 2>&1; then
  echo "check_install: the installed MPI example (mpicc + pkg-config, mpirun -np 8)"
  share="$prefix/share/reshard"
  [ -f "$share/examples/rl_weight_sync.c" ] || fail "share/reshard/examples/rl_weight_sync.c not installed"
  [ -f "$share/configs/Qwen2.5-0.5B.json" ] || fail "share/reshard/configs not installed"
  [ -f "$share/examples/watchdog.h" ] || fail "share/reshard/examples/watchdog.h not installed"
  cp "$share/examples/rl_weight_sync.c" "$share/examples/watchdog.h" "$work/"
  # shellcheck disable=SC2046 # flags are meant to split
  mpicc -std=c11 -pthread -Wall -Wextra -Werror "$work/rl_weight_sync.c" -o "$work/rl_weight_sync" \
    $(pkg-config --cflags --libs reshard_models) -Wl,-rpath,"$libdir" ||
    fail "building the installed rl_weight_sync.c"
  (unset LD_LIBRARY_PATH
   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 \
     mpirun --oversubscribe -np 8 "$work/rl_weight_sync" \
     --model-config "$share/configs/Qwen2.5-0.5B.json" --layers 2 --steps 2) >"$work/sync.log" 2>&1 ||
    { cat "$work/sync.log"; fail "the installed rl_weight_sync (mpirun -np 8)"; }
  grep '^# rl_weight_sync: OK' "$work/sync.log" || { cat "$work/sync.log"; fail "rl_weight_sync did not say OK"; }
fi

# The header promises extern "C": it must at least parse as C++.
if command -v c++ >/dev/null 2>&1; then
  echo "check_install: reshard.h as C++"
  # shellcheck disable=SC2046 # flags are meant to split
  c++ -fsyntax-only -Wall -Wextra -Werror -x c++ "$work/src/main.c" \
    $(pkg-config --cflags reshard) || fail "reshard.h does not parse as C++"
  echo "check_install: reshard_selftest.h as C++"
  echo '#include <reshard_selftest.h>' | c++ -fsyntax-only -Wall -Wextra -Werror -x c++ - \
    $(pkg-config --cflags reshard) || fail "reshard_selftest.h does not parse as C++"
  echo "check_install: reshard_inproc.h as C++"
  echo '#include <reshard_inproc.h>' | c++ -fsyntax-only -Wall -Wextra -Werror -x c++ - \
    $(pkg-config --cflags reshard) || fail "reshard_inproc.h does not parse as C++"
  echo "check_install: reshard_models.h as C++"
  # shellcheck disable=SC2046 # flags are meant to split
  c++ -fsyntax-only -Wall -Wextra -Werror -x c++ "$work/src/models.c" \
    $(pkg-config --cflags reshard_models) || fail "reshard_models.h does not parse as C++"
fi

echo "check_install: OK"
