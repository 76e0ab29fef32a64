#!/usr/bin/env python3
"""Checks the layering that docs/ARCHITECTURE.md draws ("Layers"): a file
under src/<folder>/ or kernels/ includes project headers only from its own
folder or from folders on a lower floor. Public headers (include/) are
open to everyone. Exit status 1, with every offending include listed, when
an include reaches up or sideways. Above the library, tools/ and bench/
include public headers (include/), the one internal header
src/reshard_internal.h and their own headers (tools/, bench/, examples/)
only. Run by .ci/run and by ctest (check_layers)."""
import os
import re
import sys

# Lowest floor first. A folder may include its own headers and those of
# folders on lower floors; folders on one floor do not include each other.
FLOORS = [
    ["common"],
    ["pack", "layout", "selftest"],
    ["kernels", "models"],
    ["cuda"],
    ["transport"],
    ["plan"],
    ["exec"],
    ["device"],
    ["api"],
]
FLOOR = {f: i for i, fl in enumerate(FLOORS) for f in fl}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = (".c", ".h", ".cu", ".cuh")
# Above the library: folders that may include only public headers, the
# internal header and headers of these folders.
USERS = ("tools", "bench")
USER_HEADERS = ("include", "tools", "bench", "examples")
INTERNAL = "reshard_internal.h"


def folder_of(path):
    parts = path.split(os.sep)
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "kernels":
        return "kernels"
    return None


def violations(root):
    bad = []
    unknown = set()
    for top in ("src", "kernels"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                rel = os.path.relpath(os.path.join(d, name), root)
                me = folder_of(rel)
                if me not in FLOOR:
                    unknown.add(me)
                    continue
                with open(os.path.join(root, rel), errors="replace") as f:
                    for ln, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue  # public headers and same-folder names
                        it = m.group(1).split("/")[0]
                        if it == me:
                            continue
                        if it not in FLOOR:
                            unknown.add(it)
                        elif FLOOR[it] >= FLOOR[me]:
                            how = "up" if FLOOR[it] > FLOOR[me] else "sideways"
                            bad.append("%s:%d: %s (floor %d) includes %s (floor %d): %s" %
                                       (rel, ln, me, FLOOR[me], m.group(1), FLOOR[it], how))
    bad += user_violations(root)
    for u in sorted(x for x in unknown if x):
        bad.append("folder '%s' has no floor in scripts/check_layers.py" % u)
    return bad


def user_violations(root):
    """tools/ and bench/: an include of a path (src/'s folder/name.h) or of
    a name none of USER_HEADERS nor src/reshard_internal.h holds."""
    bad = []
    for top in USERS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                rel = os.path.relpath(os.path.join(d, name), root)
                with open(os.path.join(root, rel), errors="replace") as f:
                    for ln, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        h = m.group(1)
                        ok = h == INTERNAL or ("/" not in h and any(
                            os.path.isfile(os.path.join(root, u, h)) for u in USER_HEADERS))
                        if not ok:
                            bad.append("%s:%d: %s includes %s: only include/*.h, %s and "
                                       "its own headers" % (rel, ln, top, h, INTERNAL))
    return bad


def self_test():
    """The checker on a made-up tree: what must pass passes, and each kind
    of offence (up, sideways, a folder without a floor) is found."""
    import tempfile
    files = {
        "src/plan/ok.c": '#include "plan/plan.h"\n#include "transport/transport.h"\n#include "reshard.h"\n',
        "src/transport/up.c": '#include "common/error.h"\n#include "device/device.h"\n',
        "src/pack/side.c": '#include "layout/layout.h"\n',
        "src/newdir/x.c": '#include "common/error.h"\n',
        "kernels/k.cu": '#include "pack/copy.h"\n  #  include "exec/schedule.h"\n',
        "include/reshard.h": "",
        "src/reshard_internal.h": '#include "plan/plan.h"\n',
        "tools/t.c": '#include "reshard.h"\n#include "reshard_internal.h"\n#include "t.h"\n'
                     '#include "plan/plan.h"\n#include "nowhere.h"\n',
        "tools/t.h": '#include "reshard.h"\n',
        "bench/b.c": '#include "t.h"\n#include "common/error.h"\n',
    }
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        bad = violations(root)
    want = ["src/transport/up.c:2:", "src/pack/side.c:1:", "kernels/k.cu:2:",
            "tools/t.c:4:", "tools/t.c:5:", "bench/b.c:2:", "folder 'newdir'"]
    found = [w for w in want if any(b.startswith(w) for b in bad)]
    if found != want or len(bad) != len(want):
        print("check_layers self-test FAILED: wanted %s, got %s" % (want, bad))
        return 1
    print("check_layers self-test: %d offences found, none invented" % len(bad))
    return 0


def main(root):
    bad = violations(root)
    for b in bad:
        print(b)
    if bad:
        print("check_layers: %d include(s) break the layering of docs/ARCHITECTURE.md" % len(bad))
        return 1
    print("check_layers: every include goes down (%d floors)" % len(FLOORS))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))
