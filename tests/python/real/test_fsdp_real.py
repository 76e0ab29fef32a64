"""reshard.Layout.from_module against the real torch FSDP2 and DTensor
(PyPI's torch on CPU, gloo) and transformers' own LlamaForCausalLM: the
MPI job of fsdp_world.py (see its docstring). Run by
scripts/test_real.sh; skipped where torch, transformers or mpirun are
missing."""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("mpi4py")

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD_DEADLINE_S = 900


def test_fsdp_world():
    """6 FSDP2 trainer ranks (FSDP, plain-parameter, HSDP and TP x FSDP
    layouts read from live DTensors, every fragment against the local
    tensors; Partial and a rank on another mesh refused) and the FSDP /
    TP x FSDP -> vLLM tp=2 sync on 2 more ranks, every byte checked."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "8",
           sys.executable, os.path.join(HERE, "fsdp_world.py"),
           "--trainers", "6", "--port", str(29700 + os.getpid() % 100)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                           timeout=WORLD_DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail("fsdp_world.py ran past %d s: %s" % (
            WORLD_DEADLINE_S, (e.stdout or b"")[-3000:]))
    lines = [ln for ln in r.stdout.splitlines()
             if ln.startswith("FAIL") or " passed, " in ln]
    print("\n".join(lines[-60:]))
    assert r.returncode == 0, "\n".join(lines[-60:]) + r.stderr[-3000:]
    assert any(ln.endswith(" passed, 0 failed") for ln in lines)


def test_fsdp_example():
    """examples/python/fsdp_weight_sync.py as python/README.md runs it: 4 FSDP2
    ranks -> vLLM tp=2, 2 layers, every element checked by the example."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "6",
           sys.executable, os.path.join(root, "examples/python/fsdp_weight_sync.py"),
           "--model-config", os.path.join(root, "configs/Qwen2.5-0.5B.json"),
           "--layers", "2", "--train-ranks", "4", "--infer", "tp=2",
           "--steps", "2", "--port", str(29800 + os.getpid() % 100),
           "--deadline", str(WORLD_DEADLINE_S - 60)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                           timeout=WORLD_DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail("fsdp_weight_sync.py ran past %d s: %s" % (
            WORLD_DEADLINE_S, (e.stdout or b"")[-3000:]))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "step 2: " in r.stdout and ", 0 wrong" in r.stdout, r.stdout[-3000:]
    assert "fsdp_weight_sync: OK (4 FSDP2 ranks -> vLLM tp=2, 2 steps" in r.stdout
