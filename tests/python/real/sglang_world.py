"""One MPI job against the real SGLang (0.5.23, PyPI's wheel, on torch's
CPU device): Megatron trainer ranks and SGLang TP worker processes,
reshard's SGLang adapter (reshard.integrations.sglang) between them.

    mpirun -n 4 python sglang_world.py --trainers 2 --port 29700

Ranks 0 .. T-1 are trainer ranks; ranks T .. T+1 are the two SGLang TP
workers of one engine, which also form their own torch.distributed world
(gloo) and SGLang's model-parallel groups for each case
(sglang.test.test_utils.publish_build_topology, then SGLang's
initialize_model_parallel). For every case (a model config, the
inference spec, the trainer's Megatron spec), every worker:

  1. builds SGLang's own model class for the config (bf16, every byte set
     to a sentinel), and a second instance of it (the reference);
  2. checks reshard's layout of its rank (reshard.models.sglang_layout)
     against the real named_parameters(): the same names and each
     parameter's bytes;
  3. serves the trainer's sender through SGLang's own model-runner
     WeightUpdater (model_executor/model_runner_components/
     weight_updater.py): begin_weight_update, update_weights_from_tensor
     with load_format reshard.integrations.sglang.load listed as its
     custom_weight_loaders (so SGLang's dynamic_import calls reshard's
     loader with the live model), and end_weight_update(run_post_load=
     False), what SchedulerWeightUpdaterManager passes after a load. The
     stand-in is only the scheduler / tokenizer IPC: control messages
     over MPI (Engine below);
  4. after each of two steps (the trainer's weights change in between),
     checks every byte of every parameter: inside reshard's fragments
     against values from global coordinates (an independent expectation)
     AND against the reference loaded by SGLang's own load_weights with the
     same HF tensors; outside the fragments, the sentinel untouched; for
     DeepSeek, the attention's w_kc / w_vc (SGLang's post_load_weights
     copies of kv_b_proj) equal to the reference's.

Checks print "FAIL ..." lines; the last line is "N passed, M failed".
Every wait has a deadline (the control messages; reshard's own timeouts).
"""
import argparse
import os
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/python: conftest helpers
from vllm_world import (SENTINEL, Ctl, check, esize,  # noqa: E402
                        positions, torch_dtype, want, write_configs)

# (config, inference spec over the 2 workers, trainer spec over 2 ranks)
CASES = [
    ("llama", "tp=2", "tp=2"), ("llama", "pp=2", "pp=2"),
    ("qwen2", "tp=2", "pp=2"), ("qwen3", "tp=2,attn_dp=2", "tp=2"),
    ("qwen3_moe", "tp=2", "dp=2,ep=2"), ("qwen3_moe", "tp=2,ep=2", "tp=2"),
    ("mixtral", "tp=2", "tp=2"),
    ("deepseek_v3", "tp=2", "tp=2"),
    ("deepseek_v3_nolora", "tp=2,attn_dp=2", "pp=2"),
    # two engines (SGLang serves --dp-size replicas through
    # update_weights_from_tensor only as separate engines), one worker each
    ("qwen3_moe", "tp=1,dp=2", "tp=2"),
    # Last (it ends in a refusal): the workers run SGLang at tp=2 while
    # the spec says pp=2. Each worker's loader refuses before it knows
    # its rank; over "mpi" it must still take part in the communicator's
    # creation (MPI_Comm_dup, no deadline), else the trainer waits there
    # forever: the trainer fails at its plan's deadline instead, and no
    # worker byte changes.
    ("qwen2", "pp=2", "tp=2", "tp=2"),
]
REFUSE_TIMEOUT_MS = 3000


def runs(case):
    """The widths the SGLang workers run: the spec's, unless the case
    names others (a refusal case)."""
    return case[3] if len(case) > 3 else case[1]

# SGLang 0.5.23's class for each architecture (srt/models/*.py)
CLASSES = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
}


def spec_of(s):
    return {k: int(v) for k, v in (kv.split("=") for kv in s.split(","))}


def build(path):
    """SGLang's model class for the config at ``path``, bf16 on the CPU,
    every byte the sentinel."""
    import importlib
    import torch
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(os.path.dirname(path))
    mod, cls = CLASSES[cfg.architectures[0]]
    klass = getattr(importlib.import_module("sglang.srt.models." + mod), cls)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = klass(cfg)
    finally:
        torch.set_default_dtype(old)
    for p in model.parameters():
        p.data.view(torch.uint8).fill_(SENTINEL)
    return model


def topology(w, infer):  # w: the rank in this engine
    """SGLang's parallel context, model-parallel groups and attention-DP
    state for this case (the torch.distributed world stays). Built without PyNccl (the one
    stand-in of the groups: SGLang's init_model_parallel_group enables it
    on every in-tree platform, CPU included, and its constructor needs a
    CUDA device, torch.cuda.device(cpu) raising here); the groups' gloo
    cpu_group is all that building and loading a model uses."""
    import functools
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import (
        destroy_model_parallel, initialize_model_parallel,
        model_parallel_is_initialized)
    from sglang.test.test_utils import publish_build_topology
    if not getattr(parallel_state.init_model_parallel_group, "no_pynccl", 0):
        group = functools.partial(parallel_state.init_model_parallel_group,
                                  use_pynccl=False)
        group.no_pynccl = 1
        parallel_state.init_model_parallel_group = group
    if model_parallel_is_initialized():
        destroy_model_parallel()
    sp = spec_of(infer)
    publish_build_topology(world_rank=w, tp_size=sp.get("tp", 1),
                           pp_size=sp.get("pp", 1), ep_size=sp.get("ep", 1),
                           attn_dp_size=sp.get("attn_dp", 1))
    initialize_model_parallel(backend="gloo")
    # what SGLang's bootstrap does next (distributed/bootstrap.py):
    # attention DP's flags (is_dp_attention_enabled) and ranks
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.runtime_context import get_server_args
    initialize_dp_attention(server_args=get_server_args())


class Engine:
    """sglang.Engine's weight-update methods (entrypoints/engine.py) over
    MPI control messages to this engine's workers: the scheduler and
    tokenizer IPC is the stand-in; each worker runs SGLang's own
    WeightUpdater."""

    def __init__(self, ctl, workers):
        self.ctl, self.workers, self.calls = ctl, workers, []

    def _all(self, *msg):
        self.calls.append(msg[0])
        for w in self.workers:
            self.ctl.send(w, msg)
        out = [self.ctl.recv(w) for w in self.workers]
        bad = [m for ok, m in out if not ok]
        return (not bad, bad[0] if bad else "Success")

    def begin_weight_update(self):
        return self._all("begin")

    def update_weights_from_tensor(self, named_tensors, load_format=None,
                                   flush_cache=True):
        return self._all("update", named_tensors, load_format)

    def end_weight_update(self):
        return self._all("end")


# ------------------------------------------------------------------ trainer
def trainer(rank, T, W, ctl, paths):
    import torch
    import reshard
    from reshard.integrations.sglang import (ReshardSGLangInitInfo,
                                             SGLangTrainer)
    bad = passed = 0
    for ci, case in enumerate(CASES):
        cfg, infer, train = case[:3]
        refusal = runs(case) != infer
        path = os.path.join(paths[cfg], "config.json")
        src = reshard.models.megatron_layout(path, train)
        bufs, tensors = {}, {}
        dtype = {src.buffer_name(f.buffer): f.dtype for f in src.fragments(rank)}
        for n, b in src.buffers(rank).items():
            bufs[n] = np.full(src.buffer_bytes(b, rank), SENTINEL, np.uint8)
            tensors[n] = torch.from_numpy(bufs[n]).view(torch_dtype(dtype[n]))

        def fill(step):
            for f in src.fragments(rank):
                es = esize(f.dtype)
                buf = bufs[src.buffer_name(f.buffer)]
                buf[positions(f, es)] = want(f.tensor, src.tensor(f.tensor).shape,
                                             f.box, es, step)
        passes = []

        def source():  # Megatron's names under DDP's double wrapping
            passes.append(1)
            return [("module.module." + n, t) for n, t in tensors.items()]
        fill(1)
        info = ReshardSGLangInitInfo(model_config_path=path, train=train,
                                     infer=infer, world_size=T + W,
                                     transport="mpi",
                                     timeout_ms=REFUSE_TIMEOUT_MS if refusal
                                     else 60000)
        dp = spec_of(infer).get("dp", 1)
        per = W // dp  # the workers of one engine (replica)
        engines = [Engine(ctl, list(range(T + d * per, T + (d + 1) * per)))
                   for d in range(dp)] if rank == 0 else []
        tr = SGLangTrainer(info, rank, source, engines=engines)
        if refusal:
            bad += trainer_refused(tr, ci, rank)
            passes = [1, 1]
        for step in () if refusal else (1, 2):
            if step == 2:
                fill(2)  # the optimizer step, in place
            tr.send_weights()
        tr.shutdown()
        if len(passes) != 2:
            bad += 1
            print("FAIL case %d: the trainer read the source %d times in 2 "
                  "steps" % (ci, len(passes)))
        if rank == 0:
            for d, engine in enumerate(engines):
                if engine.calls != ["begin", "update", "end"] * (
                        1 if refusal else 2):
                    bad += 1
                    print("FAIL case %d: engine %d's control calls %s"
                          % (ci, d, engine.calls))
            for w in range(T, T + W):
                ctl.send(w, ("next",))
        passed += 1
    return bad, passed if rank == 0 else 0


def trainer_refused(tr, ci, rank):
    """The refusal case's trainer: send_weights raises (the sender: the
    worker's refusal, naming the width; the other rank: its plan's
    TimeoutError) within the plan's deadline plus slack, not hanging."""
    import reshard
    t0 = time.time()
    try:
        tr.send_weights()
    except reshard.Error as e:
        took = time.time() - t0
        print("# case %d rank %d: %s after %.1f s: %s" % (
            ci, rank, type(e).__name__, took, str(e)[-300:]))
        want = "tp_size=2" if rank == 0 else ""
        if want not in str(e) or (rank and not isinstance(
                e, reshard.TimeoutError)):
            print("FAIL case %d rank %d: send_weights raised %s: %s"
                  % (ci, rank, type(e).__name__, e))
            return 1
        # (the workers' SGLang import and model builds come first)
        if took > REFUSE_TIMEOUT_MS / 1e3 + 150:
            print("FAIL case %d rank %d: the refusal took %.1f s"
                  % (ci, rank, took))
            return 1
        return 0
    print("FAIL case %d rank %d: send_weights did not raise" % (ci, rank))
    return 1


# ------------------------------------------------------------------ worker
def worker(rank, T, W, ctl, paths, port):
    import reshard
    from reshard.integrations import sglang as rsgl
    from sglang.srt.distributed.parallel_state import (
        destroy_distributed_environment, destroy_model_parallel,
        init_distributed_environment, model_parallel_is_initialized)
    from sglang.srt.model_executor.model_runner_components.weight_updater \
        import WeightUpdater
    from sglang.srt.runtime_context import get_parallel

    w = rank - T
    bad = passed = 0

    def fail(msg):
        nonlocal bad
        bad += 1
        print("FAIL rank %d: %s" % (rank, msg))

    for ci, case in enumerate(CASES):
        cfg, infer, train = case[:3]
        refusal = runs(case) != infer
        what = "case %d (%s infer %s train %s)" % (ci, cfg, infer, train)
        path = os.path.join(paths[cfg], "config.json")
        # each engine's workers form their own torch.distributed world
        # (gloo), as one SGLang engine's processes do
        sp = spec_of(runs(case))
        per = sp.get("tp", 1) * sp.get("pp", 1)
        if model_parallel_is_initialized():
            destroy_model_parallel()
        destroy_distributed_environment()
        init_distributed_environment(
            world_size=per, rank=w % per, local_rank=w % per, backend="gloo",
            distributed_init_method="tcp://127.0.0.1:%d" % (
                port + 10 * ci + w // per))
        topology(w % per, runs(case))
        model, ref = build(path), build(path)
        dst = reshard.models.sglang_layout(path, infer, first_rank=T)
        live = dict(model.named_parameters())
        bufs = {} if refusal else dst.buffers(rank)
        if set(bufs) != set(live) and not refusal:
            fail("%s: reshard's names on rank %d differ from SGLang's "
                 "named_parameters(): only reshard %s, only SGLang %s" % (
                     what, rank, sorted(set(bufs) - set(live))[:4],
                     sorted(set(live) - set(bufs))[:4]))
        for n, b in bufs.items():
            p = live.get(n)
            if p is not None and p.numel() * p.element_size() != \
                    dst.buffer_bytes(b, rank):
                fail("%s: %s is %s in SGLang (%d bytes), %d in reshard's "
                     "layout" % (what, n, tuple(p.shape),
                                 p.numel() * p.element_size(),
                                 dst.buffer_bytes(b, rank)))
        updater = WeightUpdater(
            tp_rank=get_parallel().tp_rank, device="cpu", gpu_id=0,
            model_config=None, custom_weight_loaders=[rsgl.LOADER],
            get_model=lambda m=model: m, update_model_fields=None,
            recapture_cuda_graph=None, get_model_runner=None)
        step, refused = 0, ""
        while True:
            msg = ctl.recv(0)
            if msg[0] == "next":
                break
            try:
                if msg[0] == "begin":
                    updater.begin_weight_update()
                    reply = (True, "")
                elif msg[0] == "update":
                    reply = updater.update_weights_from_tensor(
                        named_tensors=msg[1], load_format=msg[2])
                    step += 1
                elif refusal:  # "end": nothing may have changed
                    updater.end_weight_update(run_post_load=False)
                    untouched(model, what, fail)
                    reply = (True, "")
                else:  # "end", after a load (run_post_load = not loaded)
                    updater.end_weight_update(run_post_load=False)
                    check(step, dst, rank, model, ref, path, what, fail,
                          engine="SGLang")
                    check_mla(step, model, ref, what, fail)
                    reply = (True, "")
            except Exception:
                reply = (False, traceback.format_exc()[-1500:])
                if refusal and msg[0] == "update":
                    refused = reply[1]
            ctl.send(0, reply)
        if refusal and "InvalidArgumentError" not in refused:
            fail("%s: the loader did not refuse with InvalidArgumentError: "
                 "%s" % (what, refused[-300:]))
        if step != (0 if refusal else 2):
            fail("%s: %d updates, not %d" % (what, step, 0 if refusal else 2))
        rsgl.close(model)
        passed += 1
    return bad, passed


def untouched(model, what, fail):
    """Every byte of every parameter still the sentinel."""
    import torch
    for n, p in model.named_parameters():
        b = p.data.contiguous().view(torch.uint8)
        if not bool((b == SENTINEL).all()):
            fail("%s: %s changed after the refusal" % (what, n))


def check_mla(step, model, ref, what, fail):
    """DeepSeek: the attention's w_kc / w_vc (post_load_weights' copies of
    kv_b_proj) equal to those SGLang's load_weights derived."""
    import torch
    for (n, a), (_, b) in zip(model.named_modules(), ref.named_modules()):
        for attr in ("w_kc", "w_vc"):
            x, y = getattr(a, attr, None), getattr(b, attr, None)
            if not isinstance(y, torch.Tensor):
                continue
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or \
                    not torch.equal(x.contiguous().view(torch.uint8),
                                    y.contiguous().view(torch.uint8)):
                fail("%s step %d: %s.%s differs from SGLang's load_weights'"
                     % (what, step, n, attr))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--out", default="/tmp/reshard-sglang-world")
    ap.add_argument("--cases", default="")
    a = ap.parse_args()
    if a.cases:
        keep = [int(i) for i in a.cases.split(",")]
        CASES[:] = [CASES[i] for i in keep]
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    T, W = a.trainers, comm.Get_size() - a.trainers
    if W != 2:
        sys.exit("sglang_world.py: the cases need 2 workers; got %d" % W)
    ctl = Ctl(comm.Dup())
    paths = write_configs(os.path.join(a.out, "r%d" % rank))
    t0 = time.time()
    try:
        if rank < T:
            bad, passed = trainer(rank, T, W, ctl, paths)
        else:
            bad, passed = worker(rank, T, W, ctl, paths, a.port)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        comm.Abort(3)
    tot = comm.allreduce(np.array([passed, bad]), op=MPI.SUM)
    if rank == 0:
        print("%d passed, %d failed" % (tot[0], tot[1]))
        print("# %.0f s" % (time.time() - t0))
    sys.stdout.flush()
    sys.exit(1 if tot[1] else 0)


if __name__ == "__main__":
    main()
