"""One MPI job against the real torch FSDP2 (PyPI's torch, CPU, gloo):
layouts read from live DTensors, and the sync FSDP2 -> vLLM layout.

    mpirun -n 8 python fsdp_world.py --trainers 6 --port 29700

Ranks 0 .. T-1 are trainer ranks, a torch.distributed world of their own
(gloo); the ranks after them are inference ranks. The model is
transformers' own LlamaForCausalLM built from a config (random-free:
every parameter is set from global coordinates before it is sharded),
sharded by torch's own fully_shard and parallelize_module. Sizes are
chosen so that chunks are uneven (intermediate 14 over tp 2 x dp 3: the
case where FSDP2's data and torch's _StridedShard metadata disagree).

Layout cases (every trainer rank, reshard.Layout.from_module):
  fsdp      fully_shard over 6 ranks (Shard(0), uneven)
  layers    fully_shard on the layers only: embeddings, final norm and
            lm_head stay plain tensors, replicated
  hsdp      fully_shard over a (2, 3) mesh: (Replicate(), Shard(0))
  tp_fsdp   ColwiseParallel / RowwiseParallel over tp 2, fully_shard over
            dp 3: (_StridedShard(0, sf=2), Shard(0)), (Shard(0),
            Shard(1)), and norms on the dp sub-mesh
For each, every rank checks each of its fragments against its local
tensor (values from global coordinates, an independent expectation)
(and, for fsdp and hsdp, that reshard.models.fsdp_layout of the config
gives every rank the same boxes; so for transformers' Qwen2 with biases
and tied embeddings, Qwen3 and Mistral, FSDP and HSDP),
that its fragments cover its local tensor exactly, and rank 0 that every
element of every parameter is held by some rank.

Refusals: a Partial DTensor (UnsupportedError naming the parameter), and
one rank describing another mesh (the plan's MismatchError names the
buffer).

Sync cases: fsdp and tp_fsdp trainers -> reshard.models.vllm_layout
"tp=2" on the inference ranks (fused qkv_proj / gate_up_proj, padded
vocabulary), the inference ranks building the source layout from the
trainer's reshard.dtensor.describe() sent over MPI; two steps (the
trainer's local shards change in between); every destination byte
checked against values from global coordinates, the sentinel outside
fragments untouched.

The last line is "N passed, M failed". Every wait has a deadline
(reshard's timeouts; the MPI messages are under a watchdog).
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

SENTINEL = 0xA5
DEADLINE_S = 600

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 14, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
    "vocab_size": 203, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
    "attention_bias": False, "mlp_bias": False,
    "max_position_embeddings": 128,
}


def watchdog(seconds):
    """Ends the job if it outlives its deadline (a hung collective)."""
    def kill():
        time.sleep(seconds)
        print("FAIL watchdog: the job ran past %d s" % seconds, flush=True)
        os._exit(3)
    threading.Thread(target=kill, daemon=True).start()


def values(name, shape, step):
    """A parameter's values from global coordinates: small integers over
    32, exact in bf16, different per parameter and step."""
    import torch
    seed = sum(map(ord, name)) * 31 + step * 7
    n = 1
    for s in shape:
        n *= s
    idx = torch.arange(n, dtype=torch.int64)
    v = ((idx * 13 + seed) % 251 - 125).to(torch.float32) / 32
    return v.reshape(shape).to(torch.bfloat16)


def build(case, T):
    """transformers' LlamaForCausalLM, every parameter from values(),
    sharded as `case` says over the T trainer ranks."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel,
                                                   RowwiseParallel,
                                                   parallelize_module)
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**{k: v for k, v in CONFIG.items()
                         if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(values(n, tuple(p.shape), 0))
    if case in ("fsdp", "layers"):
        mesh = init_device_mesh("cpu", (T,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        if case == "fsdp":
            fully_shard(model, mesh=mesh)
    elif case == "hsdp":
        mesh = init_device_mesh("cpu", (2, T // 2),
                                mesh_dim_names=("replicate", "shard"))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif case == "tp_fsdp":
        mesh = init_device_mesh("cpu", (T // 2, 2), mesh_dim_names=("dp", "tp"))
        plan = {}
        for i in range(CONFIG["num_hidden_layers"]):
            for m in ("self_attn.q_proj", "self_attn.k_proj",
                      "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
                plan["model.layers.%d.%s" % (i, m)] = ColwiseParallel()
            for m in ("self_attn.o_proj", "mlp.down_proj"):
                plan["model.layers.%d.%s" % (i, m)] = RowwiseParallel()
        parallelize_module(model, mesh["tp"], plan)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    else:
        raise ValueError(case)
    return model


# the twin's other models (transformers' own classes from the config):
# Qwen2 with q/k/v biases and tied embeddings, Qwen3 with q/k norms,
# Mistral; sizes uneven over the trainer ranks
TWINS = {
    "qwen2": dict(hidden_size=64, intermediate_size=22, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, vocab_size=101,
                  tie_word_embeddings=True),
    "qwen3": dict(hidden_size=64, intermediate_size=22, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                  vocab_size=101, tie_word_embeddings=False),
    "mistral": dict(hidden_size=64, intermediate_size=22, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=16, num_hidden_layers=2,
                    vocab_size=101, tie_word_embeddings=False),
}


def twin_cases(cfg_dir, rank, T, tally):
    """reshard.models.fsdp_layout (the config alone) against
    Layout.from_module of transformers' model for the same config sharded
    by fully_shard, FSDP and HSDP: every rank's boxes, under the same
    names."""
    import torch
    import reshard
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM
    for mt, kw in TWINS.items():
        path = os.path.join(cfg_dir, mt + ".json")
        if rank == 0:
            with open(path + ".tmp", "w") as fh:
                json.dump(dict(kw, model_type=mt, torch_dtype="bfloat16"), fh)
            os.replace(path + ".tmp", path)
        torch.distributed.barrier()
        for spec, shape in (("dp_shard=%d" % T, (T,)),
                            ("dp_shard=%d,dp_replicate=2" % (T // 2), (2, T // 2))):
            model = AutoModelForCausalLM.from_config(
                AutoConfig.for_model(mt, **kw), dtype=torch.bfloat16)
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=(
                "replicate", "shard")[-len(shape):])
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            L = reshard.Layout.from_module(model)
            twin = reshard.models.fsdp_layout(path, spec)
            tally.check(sorted(i.name for i in L.tensors()) ==
                        sorted(i.name for i in twin.tensors()),
                        "%s %s: tensor names differ: %s" % (mt, spec, sorted(
                            {i.name for i in L.tensors()} ^
                            {i.name for i in twin.tensors()})[:4]))
            for r in range(T):
                a = sorted((f.name, f.box) for f in L.fragments(r))
                b = sorted((f.name, f.box) for f in twin.fragments(r))
                tally.check(a == b, "%s %s: rank %d: from_module and "
                            "fsdp_layout differ: %s" % (
                                mt, spec, r, sorted(set(a) ^ set(b))[:4]))


def snippet(name):
    """A python/README.md snippet (<!-- readme-snippet: name --> before
    its code block), unindented."""
    import re
    import textwrap
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                        "..", "..")
    text = open(os.path.join(root, "python", "README.md")).read()
    m = re.search(r"<!-- readme-snippet: %s -->\s*```\w*\n(.*?)```"
                  % re.escape(name), text, re.S)
    if not m:
        raise AssertionError("python/README.md has no snippet %r" % name)
    return textwrap.dedent(m.group(1))


def positions(f):
    """Element indices of fragment f in its buffer, box order."""
    idx = np.meshgrid(*[np.arange(hi - lo) for lo, hi in f.box], indexing="ij")
    return sum(i.ravel() * s for i, s in zip(idx, f.strides)) + f.offset // 2


def bits(t):
    import torch
    return t.contiguous().view(torch.int16).numpy().ravel()


class Tally:
    def __init__(self, rank):
        self.rank, self.ok, self.bad = rank, 0, 0

    def check(self, cond, what):
        if cond:
            self.ok += 1
        else:
            self.bad += 1
            print("FAIL rank %d: %s" % (self.rank, what), flush=True)


def check_layout(case, L, model, rank, T, tally):
    """Every fragment of this rank against its local tensor and the
    global values; the fragments cover the local tensor exactly; rank 0:
    every element held by some rank."""
    import reshard
    local = reshard.dtensor.local_tensors(model)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    seen = {n: 0 for n in local}
    for f in L.fragments(rank):
        t = local.get(f.name)
        if t is None:
            tally.check(False, "%s: %s on rank %d has no local tensor"
                        % (case, f.name, rank))
            continue
        want = values(f.name, shapes[f.name], 0)[
            tuple(slice(lo, hi) for lo, hi in f.box)]
        got = bits(t)[positions(f)]
        tally.check(np.array_equal(got, bits(want)),
                    "%s: %s box %s differs from the global values"
                    % (case, f.name, f.box))
        seen[f.name] += int(np.prod(f.shape))
    for n, t in local.items():
        tally.check(seen[n] == t.numel(), "%s: %s: fragments cover %d of "
                    "the %d local elements" % (case, n, seen[n], t.numel()))
    if rank == 0:
        for info in L.tensors():
            held = np.zeros(info.shape, bool)
            for r in range(T):
                for f in L.fragments(r):
                    if f.tensor == info.id:
                        held[tuple(slice(lo, hi) for lo, hi in f.box)] = True
            tally.check(held.all(), "%s: %s: %d elements held by no rank"
                        % (case, info.name, int((~held).sum())))
    return local


def sync(case, comm, rank, T, cfg_path, tally):
    """FSDP2 trainers -> vLLM tp=2 buffers, two steps, every byte."""
    import torch
    import reshard
    trainer = rank < T
    model = build(case, T) if trainer else None
    specs = reshard.dtensor.describe(model) if trainer and rank == 0 else None
    specs = comm.bcast(specs, root=0)
    if trainer:
        src = reshard.Layout.from_module(model)
        tally.check([(i.name, i.shape) for i in src.tensors()] ==
                    [(s.name, s.shape) for s in specs],
                    "%s: rank %d's layout differs from rank 0's description"
                    % (case, rank))
    else:
        src = reshard.dtensor.layout(specs)
    dst = reshard.models.vllm_layout(cfg_path, "tp=2", first_rank=T)
    shapes = {s.name: s.shape for s in specs}
    bufs = {n: np.full(dst.buffer_bytes(b, rank), SENTINEL, np.uint8)
            for n, b in dst.buffers(rank).items()}
    steps = [0]

    def train(model):
        """Every local shard takes the next step's values."""
        steps[0] += 1
        local = reshard.dtensor.local_tensors(model)
        with torch.no_grad():
            for f in src.fragments(rank):
                local[f.name].view(-1)[torch.from_numpy(positions(f))] = values(
                    f.name, shapes[f.name], steps[0])[
                    tuple(slice(lo, hi) for lo, hi in f.box)].reshape(-1)

    if trainer and case == "fsdp":
        # python/README.md's FSDP2 snippet, as written, on the trainer ranks
        from mpi4py import MPI
        here = os.getcwd()
        os.chdir(os.path.dirname(cfg_path))
        try:
            exec(snippet("fsdp-trainer"), dict(
                reshard=reshard, MPI=MPI, model=model, T=T, steps=2,
                train=train))
        finally:
            os.chdir(here)
        return
    with reshard.Plan(reshard.Comm.mpi(comm), src, dst) as plan:
        for step in (1, 2):
            if trainer:
                train(model)
            plan.execute(reshard.dtensor.local_tensors(model) if trainer
                         else None, bufs, version=step)
            if trainer:
                continue
            inside = {n: np.zeros(b.size // 2, bool) for n, b in bufs.items()}
            wrong = 0
            for f in dst.fragments(rank):
                n = dst.buffer_name(f.buffer)
                pos = positions(f)
                want = bits(values(f.name, shapes[f.name], step)[
                    tuple(slice(lo, hi) for lo, hi in f.box)])
                wrong += int(np.count_nonzero(bufs[n].view(np.int16)[pos] != want))
                inside[n][pos] = True
            for n, b in bufs.items():
                outside = np.repeat(~inside[n], 2)
                wrong += int(np.count_nonzero(b[outside] != SENTINEL))
            tally.check(wrong == 0, "%s sync step %d: %d wrong elements/bytes"
                        % (case, step, wrong))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainers", type=int, default=6)
    ap.add_argument("--port", type=int, default=29700)
    args = ap.parse_args()
    watchdog(DEADLINE_S)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size, T = comm.Get_rank(), comm.Get_size(), args.trainers
    if size != T + 2 or T % 2:
        print("FAIL fsdp_world.py: run it on T + 2 ranks (vLLM tp=2), T "
              "even; got %d ranks, T %d" % (size, T), flush=True)
        sys.exit(2)
    import torch
    import torch.distributed as dist
    import reshard
    tally = Tally(rank)
    if rank < T:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=T)
    cfg_dir = tempfile.mkdtemp(prefix="reshard_fsdp_") if rank == 0 else None
    cfg_dir = comm.bcast(cfg_dir, root=0)
    cfg_path = os.path.join(cfg_dir, "config.json")
    if rank == 0:
        with open(cfg_path, "w") as fh:
            json.dump(CONFIG, fh)
    comm.Barrier()
    try:
        if rank < T:
            for case in ("fsdp", "layers", "hsdp", "tp_fsdp"):
                model = build(case, T)
                L = reshard.Layout.from_module(model)
                kinds = {type(p).__name__ for _, p in model.named_parameters()}
                tally.check(("Parameter" in kinds) == (case == "layers"),
                            "%s: parameter kinds %s" % (case, kinds))
                check_layout(case, L, model, rank, T, tally)
                if case in ("fsdp", "hsdp"):
                    # the config-driven twin gives every rank the same boxes
                    twin = reshard.models.fsdp_layout(
                        cfg_path, "dp_shard=%d" % T if case == "fsdp" else
                        "dp_shard=%d,dp_replicate=2" % (T // 2))
                    for r in range(T):
                        a = sorted((f.name, f.box) for f in L.fragments(r))
                        b = sorted((f.name, f.box) for f in twin.fragments(r))
                        tally.check(a == b, "%s: rank %d: from_module and "
                                    "fsdp_layout differ: %s" % (
                                        case, r, sorted(set(a) ^ set(b))[:4]))
                if case == "tp_fsdp":
                    pl = {str(p.placements) for _, p in model.named_parameters()}
                    tally.check(any("_StridedShard" in s for s in pl),
                                "tp_fsdp: no _StridedShard in %s" % pl)
            twin_cases(cfg_dir, rank, T, tally)
            # a Partial DTensor is a pending sum, not a value: refused
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor, Partial
            mesh = init_device_mesh("cpu", (T,))
            m = torch.nn.Module()
            m.w = torch.nn.Parameter(DTensor.from_local(
                torch.ones(3, 2), mesh, [Partial()]))
            try:
                reshard.Layout.from_module(m)
                tally.check(False, "Partial accepted")
            except reshard.UnsupportedError as e:
                tally.check("'w'" in str(e) and "Partial" in str(e),
                            "Partial refused without naming it: %s" % e)
            # a _StridedShard FSDP2 does not make (split_factor 3, the
            # later axis 2 ranks): refused, not guessed
            from torch.distributed.tensor.placement_types import _StridedShard
            from torch.distributed.tensor import Shard
            mesh2 = init_device_mesh("cpu", (T // 2, 2))
            m = torch.nn.Module()
            m.s = torch.nn.Parameter(DTensor.from_local(
                torch.ones(2, 2), mesh2, [_StridedShard(0, split_factor=3),
                                          Shard(0)]))
            try:
                reshard.Layout.from_module(m)
                tally.check(False, "_StridedShard(sf=3) over tp 2 accepted")
            except reshard.UnsupportedError as e:
                tally.check("'s'" in str(e) and "_StridedShard" in str(e),
                            "_StridedShard refused without naming it: %s" % e)
            # one rank describing another mesh: the plan names the buffer
            sub = comm.Split(0, rank)
            model = build("fsdp", T)
            L = reshard.Layout.from_module(
                model, ranks=(list(range(T)) if rank != 1 else
                              [(r + 1) % T for r in range(T)]))
            try:
                reshard.Plan(reshard.Comm.mpi(sub), L, L).close()
                tally.check(False, "a rank on another mesh accepted")
            except reshard.MismatchError as e:
                tally.check("source buffer" in str(e) and "model." in str(e),
                            "the mismatch does not name the buffer: %s" % e)
        else:
            comm.Split(1, rank)
        for case in ("fsdp", "tp_fsdp"):
            sync(case, comm, rank, T, cfg_path, tally)
    except Exception:
        traceback.print_exc()
        tally.check(False, "exception")
        sys.stdout.flush()
        comm.Abort(2)
    ok = comm.reduce(tally.ok, root=0)
    bad = comm.reduce(tally.bad, root=0)
    if rank == 0:
        print("%d passed, %d failed" % (ok, bad), flush=True)
    if rank < T:
        dist.destroy_process_group()
    sys.exit(1 if rank == 0 and bad else 0)


if __name__ == "__main__":
    main()
