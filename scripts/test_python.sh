#!/usr/bin/env bash
# The Python package's tests (called by scripts/test.sh): a virtual
# environment in build/py-venv, `pip install .` from the repository root
# (builds libreshard into the extension, as a user's install does), the
# test requirements from PyPI, then pytest over tests/python with MPI
# (mpirun with mpi4py) and UCX (processes without mpirun) required. PYTHON
# picks the interpreter (default python3). The "test" extra brings
# matplotlib for test_plot.py, which runs build/tools/reshard_plan
# (RESHARD_PLAN overrides the path; scripts/test.sh builds it first).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

py=${PYTHON:-python3}
venv=build/py-venv
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q ".[test]"
"$venv/bin/python" -c 'import reshard; print("reshard", reshard.__version__,
  "from", reshard.__file__, "MPI:", reshard.HAVE_MPI, "UCX:", reshard.HAVE_UCX, "CUDA:", reshard.HAVE_CUDA)'
# Never hang: every test has its own deadline; this is the backstop.
RESHARD_REQUIRE_MPI=1 RESHARD_REQUIRE_UCX=1 timeout 1200 "$venv/bin/python" -m pytest -q tests/python
