#!/usr/bin/env bash
# The SASS of a CUDA kernel file, summarized loop by loop, for machines
# without a GPU: what a kernel change does to the instructions a thread
# issues per element, before a device can time it (docs/PERFORMANCE.md,
# "The quantize kernel's instructions").
#
#   bash scripts/kernel_sass.sh [kernels/quant_kernels.cu] [sm_90]
#
# Prints ptxas's registers and, for each loop (a backward branch), its
# instructions and its global loads and stores with their widths. Needs
# nvcc (RESHARD_NVCC or /usr/local/cuda/bin/nvcc); cuobjdump and nvdisasm
# are taken from PATH, or fetched from PyPI (nvidia-cuda-cuobjdump,
# nvidia-cuda-nvdisasm) into ${RESHARD_SASS_TOOLS:-~/.cache/reshard-sass}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=${1:-kernels/quant_kernels.cu}
arch=${2:-sm_90}
nvcc=${RESHARD_NVCC:-/usr/local/cuda/bin/nvcc}
tools=${RESHARD_SASS_TOOLS:-$HOME/.cache/reshard-sass}

if ! command -v cuobjdump >/dev/null || ! command -v nvdisasm >/dev/null; then
  if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
    mkdir -p "$tools"
    python3 -m pip download --quiet --no-deps --index-url https://pypi.org/simple \
      -d "$tools" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for w in "$tools"/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
    chmod +x "$tools"/nvidia/cu*/bin/*
  fi
  PATH=$(echo "$tools"/nvidia/cu*/bin | tr ' ' ':'):$PATH
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$nvcc" -O3 -arch="$arch" -cubin -Xptxas -v -I src -I include -I . -o "$tmp/k.cubin" "$src" 2>&1 |
  grep -E "Compiling entry|registers|spill" || true
cuobjdump -sass "$tmp/k.cubin" > "$tmp/k.sass"
python3 - "$tmp/k.sass" <<'EOF'
import re, sys
func, rows = None, []
for line in open(sys.argv[1]):
    m = re.match(r'\s+Function : (\S+)', line)
    if m:
        func = m.group(1)
        continue
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
    if m:
        rows.append((func, int(m.group(1), 16), m.group(2)))
for f in dict.fromkeys(r[0] for r in rows):
    body = [(a, i) for g, a, i in rows if g == f]
    print(f"{f}: {len(body)} instructions")
    for a, ins in body:
        m = re.search(r'BRA (?:\S+, )?0x([0-9a-f]+)', ins)
        if not m or int(m.group(1), 16) > a:
            continue
        t = int(m.group(1), 16)
        loop = [i for b, i in body if t <= b <= a]
        mem = {}
        for i in loop:
            op = re.search(r'\b(LDG|STG|LD|ST|LDL|STL)\.E?\S*', i)
            if op:
                mem[op.group(0)] = mem.get(op.group(0), 0) + 1
        print(f"  loop {t:#06x}..{a:#06x}: {len(loop)} instructions;",
              ", ".join(f"{k} x{v}" for k, v in sorted(mem.items())) or "no memory")
EOF
