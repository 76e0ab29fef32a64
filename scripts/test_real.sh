#!/usr/bin/env bash
# Tests against the real frameworks (called by .ci/run; run it by hand the
# same way): a virtual environment with vLLM 0.33.0 and torch from PyPI
# (CUDA's wheels, used here on vLLM's CPU platform: VLLM_TARGET_DEVICE=cpu),
# verl 0.9.1 and SGLang 0.5.23 (its model classes on torch's CPU device),
# reshard installed into it with `pip install .`, then pytest over
# tests/python/real and the engine tests that need vLLM or verl.
#
#   bash scripts/test_real.sh            # venv in build/real-venv
#
# About 9.5 GB of wheels: pip keeps them in its cache (~/.cache/pip; CI
# turns it off with PIP_NO_CACHE_DIR=1: it runs once), so a
# second run on the same machine installs from there. verl 0.9.1 pins
# transformers < 5.11 while vLLM 0.33 needs >= 5.16.1: verl goes in with
# --no-deps, then its own dependencies at the versions vLLM has (what a
# user of both does; verl's code paths used here import and run).
# Environment: PYTHON (default python3), RESHARD_REAL_VENV (default
# build/real-venv).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

py=${PYTHON:-python3}
venv=${RESHARD_REAL_VENV:-build/real-venv}
start=$SECONDS
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)
"${pip[@]}" --upgrade pip
"${pip[@]}" "vllm==0.33.0" "pytest>=7" "mpi4py>=3.1"
"${pip[@]}" --no-deps "verl==0.9.1"
# verl 0.9.1's requirements (its setup.py install_requires) without the
# transformers pin; torch and transformers stay at vLLM's versions.
tv=$("$venv/bin/python" -c 'import torch, transformers; print("torch==%s transformers==%s" % (torch.__version__.split("+")[0], transformers.__version__))')
# shellcheck disable=SC2086
"${pip[@]}" accelerate codetiming datasets dill hydra-core pandas peft \
  "pyarrow>=19" pybind11 pylatexenc "ray[default]>=2.41" torchdata \
  "tensordict!=0.9.0,<=0.10.0,>=0.8.0" tensorboard wandb $tv
# SGLang 0.5.23 (39 MB wheel) with --no-deps: its pins (torch 2.14.1,
# transformers 5.19, CUDA kernel packages) would replace vLLM's; its model
# classes, parallel state and weight updater import and run on the CPU
# with vLLM's torch plus the two imports it needs that vLLM does not
# bring (ipython: sglang/utils.py; gguf: layers/quantization/gguf.py).
"${pip[@]}" --no-deps "sglang==0.5.23"
"${pip[@]}" ipython gguf $tv
echo "real-venv: installed in $((SECONDS - start)) s"

# reshard as a user installs it (the CUDA kernels off: there is no GPU
# here, and the tests below use host transports)
"${pip[@]}" --no-deps --force-reinstall . -C cmake.define.RESHARD_WITH_CUDA=OFF
"$venv/bin/python" -c 'import vllm, verl, torch, reshard, sglang; print("vllm", vllm.__version__, "verl", verl.__version__, "sglang", sglang.__version__, "torch", torch.__version__, "reshard", reshard.__version__)'

# Never hang: each test has its own deadline; this is the backstop.
VLLM_TARGET_DEVICE=cpu OMP_NUM_THREADS=1 timeout 2400 "$venv/bin/python" -m pytest -q \
  tests/python/real tests/python/test_vllm_engine.py tests/python/test_verl_engine.py
echo "real-framework tests: $((SECONDS - start)) s in all"
