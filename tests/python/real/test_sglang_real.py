"""reshard's SGLang adapter (reshard.integrations.sglang) against the real
SGLang 0.5.23 (PyPI's wheel; scripts/test_real.sh installs it with
--no-deps beside vLLM's torch, plus the two imports it needs that the
venv lacks, ipython and gguf). SGLang's own model classes, parallel
state (gloo, torch's CPU device), model-runner WeightUpdater and
post-load processing run; the stand-ins, each named where it is: the
scheduler / tokenizer IPC (the control messages that reach the
WeightUpdater) and PyNccl in SGLang's model-parallel groups (no GPU).
Each scenario runs in its own process (SGLang's parallel state is per
process); skipped where SGLang is not installed."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the real SGLang: bash scripts/test_real.sh",
                allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE_S = 900


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1")


@pytest.mark.parametrize("name", ["end_to_end", "refusals"])
def test_sglang_single_process(name):
    """sglang_single.py NAME: end_to_end (Qwen3-MoE and DeepSeek-V3 from
    Megatron to SGLang tp=1, every byte checked against global coordinates
    and SGLang's load_weights, w_kc / w_vc re-derived); refusals (spec,
    replica, payload, triton_kernels, AMX, missing post_load_weights,
    dtype; the last reaching the trainer's sender)."""
    r = subprocess.run([sys.executable, os.path.join(HERE, "sglang_single.py"),
                        name], capture_output=True, text=True, env=_env(),
                       timeout=DEADLINE_S)
    assert r.returncode == 0 and ("ok " + name) in r.stdout, \
        r.stdout[-3000:] + r.stderr[-5000:]


def test_real_sglang_world():
    """The MPI job of sglang_world.py: 2 Megatron trainer ranks, 2 SGLang
    TP worker processes, dense, tied, attention-DP, MoE (with and without
    expert parallelism) and MLA models at tp 2 and pp 2, two steps, every
    byte checked (see its docstring); last, workers whose SGLang widths
    differ from the spec refuse before knowing their rank, and the
    trainer over "mpi" fails at its plan's deadline with no byte changed
    (before the fix it waited in MPI_Comm_dup forever)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    out = os.environ.get("RESHARD_REAL_OUT", "/tmp/reshard-sglang-world")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "4",
           sys.executable, os.path.join(HERE, "sglang_world.py"),
           "--trainers", "2", "--out", out,
           "--port", str(29700 + os.getpid() % 100)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=_env(),
                           timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail("sglang_world.py ran past %d s: %s" % (
            DEADLINE_S, (e.stdout or b"")[-3000:]))
    lines = [ln for ln in r.stdout.splitlines()
             if ln.startswith(("FAIL", "#")) or " passed, " in ln]
    print("\n".join(lines[-60:]))
    assert r.returncode == 0, "\n".join(lines[-60:]) + r.stderr[-3000:]
    assert any(ln.endswith(" passed, 0 failed") for ln in lines)
