"""Processes as ranks: mpirun with mpi4py (reshard.Comm.mpi). Skipped
where mpirun or mpi4py is missing, unless RESHARD_REQUIRE_MPI=1 (the test
command sets it: there they must run)."""
import os
import shutil
import subprocess
import sys

import pytest

import reshard
from conftest import ROOT

try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False

READY = shutil.which("mpirun") and HAVE_MPI4PY and reshard.HAVE_MPI
if not READY and os.environ.get("RESHARD_REQUIRE_MPI") == "1":
    raise RuntimeError("RESHARD_REQUIRE_MPI=1 but mpirun, mpi4py or reshard's "
                       "MPI transport is missing")
pytestmark = pytest.mark.skipif(not READY, reason="needs mpirun, mpi4py and "
                                "a reshard built with MPI")


def mpirun(np_, *args, timeout=300):
    cmd = ["mpirun", "-np", str(np_)]
    if os.geteuid() == 0:
        cmd += ["--allow-run-as-root"]
    cmd += ["--oversubscribe", sys.executable] + list(args)
    env = dict(os.environ, RESHARD_TIMEOUT_MS="30000")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_random_layouts_mpi(seed):
    rc, out = mpirun(4, "tests/python/mpi_random_layouts.py", str(seed), "8")
    assert rc == 0 and "OK" in out, out


def test_rl_weight_sync_example_8_ranks():
    rc, out = mpirun(8, "examples/python/rl_weight_sync.py", "--layers", "2",
                     "--steps", "2")
    assert rc == 0, out
    assert "rl_weight_sync.py: OK (2 steps" in out, out


@pytest.mark.parametrize("doc,heading", [
    ("README.md", "## A Python example"),
    ("python/README.md", "## Python in five minutes"),
])
def test_readme_python_snippet(tmp_path, doc, heading):
    # The first program of README.md's "A Python example" and of
    # python/README.md's "Python in five minutes" runs as written.
    text = open(os.path.join(ROOT, doc)).read()
    section = text[text.index(heading):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    script = tmp_path / "readme_snippet.py"
    script.write_text(code)
    rc, out = mpirun(8, str(script))
    assert rc == 0, out
    assert "Stats(rank=0" in out and "committed_version=10" in out, out


def test_commit_in_doubt_settles_as_the_readme_says():
    """Issue 42, item 1: a rank late to a double-buffered commit; the
    others raise InDoubtError and follow python/README.md's advice (the
    block between the script's markers, which python/README.md must hold
    verbatim),
    every rank ending at one version."""
    script = open(os.path.join(ROOT, "tests/python/in_doubt.py")).read()
    block = script.split(
        "# --- python/README.md's recovery advice, as written there ---\n")[1]
    block = block.split("# ----")[0]
    assert "except reshard.InDoubtError:" in block
    # (python/README.md shows it inside a list item: indented by two spaces)
    indented = "".join("  " + line for line in block.splitlines(True))
    assert indented in open(os.path.join(ROOT, "python/README.md")).read(), block
    rc, out = mpirun(3, "tests/python/in_doubt.py", timeout=120)
    assert rc == 0 and out.count(": OK: in doubt then settled") == 3, out
