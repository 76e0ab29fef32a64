"""reshard's verl checkpoint engine through the real verl 0.9.1
(CheckpointEngineRegistry, the engine base class): 3 actor workers send
full tensors by HF name (in a scrambled order, one update as an async
generator), 2 rollout workers receive them; the manager's sequence per
update as verl runs it (prepare, build_topology, init_process_group,
send / receive, finalize); every byte checked against values from global
coordinates. tests/python/real/test_verl_real.py adds verl's config
keys, plugin import and bucketed transfer. Skipped without verl (the
default test environment has none; scripts/test_real.sh installs it)."""
import asyncio

import numpy as np
import pytest

pytest.importorskip("verl", reason="the real verl: bash scripts/test_real.sh")
torch = pytest.importorskip("torch")
from verl.checkpoint_engine.base import CheckpointEngineRegistry  # noqa: E402

import reshard  # noqa: E402
import reshard.integrations.verl as rverl  # noqa: E402,F401 (registers)
from conftest import box_linear, run_threads, values  # noqa: E402
from frameworks import tiny_config  # noqa: E402

A, R = 3, 2


def full(t, step):
    es = reshard.dtypes.size(reshard.dtypes.to_c(t.dtype))
    b = values(t.id + 1000 * step, box_linear(t.shape, [(0, s) for s in t.shape]), es)
    return np.frombuffer(b.tobytes(), np.uint8).view(np.uint16).reshape(t.shape)


@pytest.mark.parametrize("transport", ["inproc", "ucx"])
def test_verl_engine_updates(tmp_path, transport):
    """transport "ucx": the same workers over reshard.Comm.ucx, meeting at
    the master's address and the free port its prepare() found (what
    Ray-launched actor and rollout workers use without MPI; here threads
    of one process, each with its own UCX context)."""
    if transport == "ucx" and not reshard.HAVE_UCX:
        pytest.skip("needs a reshard built with UCX")
    cfg = tiny_config(tmp_path)
    world = None
    if transport == "inproc":
        reshard.integrations.WORLDS["verl"] = world = reshard.InprocWorld(A + R)
    kw = dict(transport="inproc:verl") if transport == "inproc" else \
        dict(transport="ucx", master_address="127.0.0.1")
    engines = [CheckpointEngineRegistry.new(
        "reshard", bucket_size=64 << 10, model_config_path=cfg,
        is_master=(i == 0), timeout_ms=30000, **kw)
        for i in range(A + R)]
    assert len(engines[0].groups) > 3  # several plans of <= 64 KiB
    tensors = engines[0].model.tensors()
    received = [dict() for _ in range(R)]

    for step in range(2):
        metadata = [e.prepare() for e in engines]
        actor_kw, rollout_kw = type(engines[0]).build_topology(A, R, metadata)
        kws = [{k: v[i] for k, v in actor_kw.items()} for i in range(A)] + \
              [{k: v[i] for k, v in rollout_kw.items()} for i in range(R)]
        run_threads([lambda e=e, kw=kw: e.init_process_group(**kw)
             for e, kw in zip(engines, kws)])

        def send(e, seed, step=step):
            order = list(np.random.default_rng(seed).permutation(len(tensors)))
            pairs = [(tensors[i].name, full(tensors[i], step)) for i in order]
            if step == 0:
                gen = iter(pairs)
            else:
                async def agen():
                    for p in pairs:
                        yield p
                gen = agen()
            asyncio.run(e.send_weights(gen, global_steps=step))

        def receive(e, out):
            async def consume():
                async for name, t in e.receive_weights(global_steps=step):
                    assert isinstance(t, torch.Tensor)  # what verl's adapters take
                    out[name] = t.view(torch.uint16).numpy().copy()
            asyncio.run(consume())

        run_threads([lambda e=e, i=i: send(e, 100 * step + i) for i, e in enumerate(engines[:A])] +
            [lambda e=e, o=o: receive(e, o) for e, o in zip(engines[A:], received)])
        for e in engines:
            e.finalize()
        for out in received:
            assert sorted(out) == sorted(t.name for t in tensors)
            for t in tensors:
                assert np.array_equal(out[t.name], full(t, step)), (step, t.name)
    # every actor worker sent a share
    for e in engines[:A]:
        assert sum(p.stats().send_bytes for p in e.plans) > 0
    for e in engines:
        e.close()
    if world is not None:
        world.close()
        del reshard.integrations.WORLDS["verl"]


def test_verl_engine_names_unknown_and_missing_weights(tmp_path):
    cfg = tiny_config(tmp_path)
    reshard.integrations.WORLDS["verl1"] = world = reshard.InprocWorld(2)
    e, r = [CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20,
                                         model_config_path=cfg,
                                         transport="inproc:verl1")
            for _ in range(2)]
    run_threads([lambda: e.init_process_group(rank=0, world_size=2, num_senders=1),
         lambda: r.init_process_group(rank=1, world_size=2, num_senders=1)])
    # the refusals come before anything moves (no partner needed)
    t0 = e.model.tensors()[0]
    with pytest.raises(reshard.InvalidArgumentError, match="nope"):
        asyncio.run(e.send_weights(iter([("nope", np.zeros(1))])))
    with pytest.raises(reshard.InvalidArgumentError, match="ended without"):
        asyncio.run(e.send_weights(iter([(t0.name, full(t0, 0))])))
    e.close()
    r.close()
    world.close()
    del reshard.integrations.WORLDS["verl1"]


def test_verl_engine_refuses_unknown_keywords(tmp_path):
    """A misspelt engine_kwargs.reshard key is refused, naming it (verl
    passes the user's engine_kwargs as constructor keywords)."""
    with pytest.raises(reshard.InvalidArgumentError, match="timout_ms"):
        CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20,
                                     model_config_path=tiny_config(tmp_path),
                                     timout_ms=1000)


def _pair(name, world_key, **kw):
    """One actor and one rollout engine over an inproc world, grouped."""
    reshard.integrations.WORLDS[world_key] = world = reshard.InprocWorld(2)
    e, r = [CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20,
                                         model_config_path=name,
                                         transport="inproc:" + world_key, **kw)
            for _ in range(2)]
    run_threads([lambda: e.init_process_group(rank=0, world_size=2, num_senders=1),
                 lambda: r.init_process_group(rank=1, world_size=2, num_senders=1)])
    return world, e, r


def _close(world_key, world, *engines):
    for x in engines:
        x.close()
    world.close()
    del reshard.integrations.WORLDS[world_key]


def test_verl_engine_skips_a_tied_lm_head(tmp_path):
    """A tied model: torch's state_dict (which verl's get_per_tensor_param
    iterates) lists the embedding again as lm_head.weight; the engine
    takes it as the embedding it already has, and the rollout side gets
    every tensor of the model once, every element checked. Full tensors
    in fp32 (verl's FSDP master weights) are cast to the model's bf16."""
    import json
    cfg = json.loads(open(tiny_config(tmp_path)).read())
    cfg["tie_word_embeddings"] = True
    path = tmp_path / "tied.json"
    path.write_text(json.dumps(cfg))
    world, e, r = _pair(str(path), "verl2")
    tensors = e.model.tensors()
    assert "lm_head.weight" not in [t.name for t in tensors]
    embed = [t for t in tensors if t.name == "model.embed_tokens.weight"][0]

    def finite(t):  # bf16 bits with exponent < all ones: exact in fp32
        return full(t, 0) & np.uint16(0xBFFF)

    def as_torch(t, dtype):
        return torch.from_numpy(finite(t).view(np.int16)) \
            .view(torch.bfloat16).to(dtype)

    pairs = [(t.name, as_torch(t, torch.float32 if i % 2 else torch.bfloat16))
             for i, t in enumerate(tensors)]
    pairs.insert(1, ("lm_head.weight", as_torch(embed, torch.float32)))
    got = {}

    async def consume():
        async for name, t in r.receive_weights():
            got[name] = t.view(torch.uint16).numpy().copy()
    run_threads([lambda: asyncio.run(e.send_weights(iter(pairs))),
                 lambda: asyncio.run(consume())])
    assert sorted(got) == sorted(t.name for t in tensors)
    for t in tensors:
        assert np.array_equal(got[t.name], finite(t)), t.name
    _close("verl2", world, e, r)


def test_verl_engine_fsdp_source(tmp_path):
    """source "fsdp": the training engine's get_per_tensor_param_shard
    triples (name, local shard, ShardSpec). Here each tensor is
    unsharded on the one actor (ShardSpec mesh None, as verl gives a
    parameter outside fully_shard): the plan's piece of it is sent, every
    element checked. A generator of full tensors (verl as shipped passes
    one) and a shard without its ShardSpec are refused before anything
    moves, naming the patch / the tensor. (Sharded ShardSpecs need a
    torch DeviceMesh, so a torch.distributed world: verl_fsdp_world.py.)"""
    from verl.workers.engine.spec import ShardSpec
    world, e, r = _pair(tiny_config(tmp_path), "verl3", source="fsdp")
    assert e.takes_training_engine
    tensors = e.model.tensors()

    def bf16(t):
        return torch.from_numpy(full(t, 1).astype(np.uint16).view(np.int16)) \
            .view(torch.bfloat16).reshape(-1)

    with pytest.raises(reshard.InvalidArgumentError, match="PATCH"):
        asyncio.run(e.send_weights(iter([(t.name, bf16(t)) for t in tensors])))

    class Engine:  # what patched verl passes: the training engine
        def __init__(self, with_spec=True):
            self.with_spec = with_spec

        def get_per_tensor_param_shard(self):
            return ((t.name, bf16(t), ShardSpec(full_shape=tuple(t.shape))
                     if self.with_spec else None) for t in tensors), None

    with pytest.raises(reshard.InvalidArgumentError, match="ShardSpec"):
        asyncio.run(e.send_weights(Engine(with_spec=False)))
    got = {}

    async def consume():
        async for name, t in r.receive_weights():
            got[name] = t.view(torch.uint16).numpy().copy()
    run_threads([lambda: asyncio.run(e.send_weights(Engine())),
                 lambda: asyncio.run(consume())])
    assert sorted(got) == sorted(t.name for t in tensors)
    for t in tensors:
        assert np.array_equal(got[t.name], full(t, 1)), t.name
    _close("verl3", world, e, r)


def test_verl_engine_fsdp_source_refusals(tmp_path):
    """A bad source, a non-bf16 dtype with "fsdp" (verl exports bf16
    shards) and a MoE model with "fsdp" (transformers 5 fuses its experts)
    are refused at construction, naming the keyword or the model."""
    cfg = tiny_config(tmp_path)
    with pytest.raises(reshard.InvalidArgumentError, match="'shards'"):
        CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20,
                                     model_config_path=cfg, source="shards")
    with pytest.raises(reshard.InvalidArgumentError, match="bf16"):
        CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20,
                                     model_config_path=cfg, source="fsdp",
                                     dtype="f32")
    import json
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 1,
        "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 100,
        "torch_dtype": "bfloat16"}))
    with pytest.raises(reshard.InvalidArgumentError, match="MoE"):
        CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20,
                                     model_config_path=str(moe), source="fsdp")
