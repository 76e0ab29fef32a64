"""The main job's sync from Python against the C example, back to back.

    python bench/python/compare_rl_sync.py [--rounds 4] [--np 8] [-- ARGS]

Alternates `mpirun -np 8 build/examples/rl_weight_sync ARGS` and
`mpirun -np 8 python examples/python/rl_weight_sync.py ARGS` (same
layouts, same self-test buffers; the Python one executes a Bound), each
--rounds times, and compares the median per-step sync time (the slowest
rank's execute; the first step of each run, which touches fresh pages, is
left out). Run from the repository root with the C build in build/ and
the package installed in the running interpreter.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

STEP = re.compile(r"^\s+(\d+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+(\d+)\s*$")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode != 0 or ": OK (" not in out:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out))
    ms = [float(m.group(2)) for m in map(STEP.match, out.splitlines())
          if m and int(m.group(1)) > 0]
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--c-binary", default="build/examples/rl_weight_sync")
    ap.add_argument("args", nargs="*", default=["--layers", "4", "--steps", "6"])
    a = ap.parse_args()
    mpirun = ["mpirun", "-np", str(a.np), "--oversubscribe"]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    c_cmd = mpirun + [a.c_binary] + a.args
    py_cmd = mpirun + [sys.executable, "examples/python/rl_weight_sync.py"] + a.args
    res = {"C": [], "Python": []}
    for r in range(a.rounds):
        for name, cmd in (("C", c_cmd), ("Python", py_cmd)):
            ms = run(cmd)
            res[name] += ms
            print("round %d %-6s steps %s ms" % (r, name,
                                                 " ".join("%.1f" % x for x in ms)),
                  flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print("# median sync_ms over %d steps each: C %.2f, Python %.2f; "
          "Python / C = %.3f" % (len(res["C"]), med["C"], med["Python"],
                                 med["Python"] / med["C"]))


if __name__ == "__main__":
    main()
