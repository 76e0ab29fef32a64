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


def test_verl_engine_updates(tmp_path):
    cfg = tiny_config(tmp_path)
    reshard.integrations.WORLDS["verl"] = world = reshard.InprocWorld(A + R)
    engines = [CheckpointEngineRegistry.new(
        "reshard", bucket_size=64 << 10, model_config_path=cfg,
        transport="inproc:verl", is_master=(i == 0), timeout_ms=30000)
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
