"""reshard's verl checkpoint engine with the real verl 0.9.1 and torch:
3 actor workers -> 2 rollout workers over 2 steps, every byte checked.

Real: verl's CheckpointEngineConfig (the user's config keys), its plugin
import (import_external_libs of custom_backend_module, as
verl/workers/engine_workers.py and verl/checkpoint_engine/base.py do),
CheckpointEngineRegistry.new with engine_kwargs[backend], the manager's
sequence per update (prepare, build_topology, init_process_group,
send_weights / receive_weights, finalize), and on the rollout side
verl's own BucketedWeightSender / BucketedWeightReceiver
(verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py, in its
shared-memory mode: the CUDA IPC mode needs a GPU), which is what the
vLLM server adapter does with the tensors the engine yields. Not run:
CheckpointEngineManager itself and the Ray worker groups (they place
workers on GPUs through Ray); the sequence above is the manager's.
Ranks are threads of this process (transport inproc)."""
import asyncio
import os
import sys
import types
import uuid

import pytest

pytest.importorskip("verl", reason="the real verl: bash scripts/test_real.sh")
torch = pytest.importorskip("torch")
pytest.importorskip("zmq")

import numpy as np  # noqa: E402

import reshard  # noqa: E402
from reshard.integrations import WORLDS  # noqa: E402
from verl.checkpoint_engine.base import CheckpointEngineRegistry  # noqa: E402
from verl.utils.import_utils import import_external_libs  # noqa: E402
from verl.workers.config.rollout import CheckpointEngineConfig  # noqa: E402
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import (  # noqa: E402
    BucketedWeightReceiver, BucketedWeightSender)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import box_linear, run_threads, values  # noqa: E402
from frameworks import tiny_config  # noqa: E402

A, R = 3, 2


def full(t, step):
    """The whole tensor at a step, from global coordinates, as torch."""
    d = reshard.dtypes.to_c(t.dtype)
    b = values(t.id + 1000 * step, box_linear(t.shape, [(0, s) for s in t.shape]),
               reshard.dtypes.size(d))
    return torch.frombuffer(bytearray(b.tobytes()), dtype=torch.uint8).view(
        getattr(torch, reshard.dtypes.torch_name(d))).reshape(t.shape)


@pytest.fixture
def cpu_bucket_transfer(monkeypatch):
    """verl's bucketed transfer on a machine without a GPU: its
    get_torch_device() falls back to torch.cuda (no driver here), so it
    gets the host's (synchronize; nothing to collect or empty); and its ZMQ sockets get a deadline
    (verl's own receive waits forever for a sender that failed)."""
    import zmq
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as bwt
    cpu = types.SimpleNamespace(synchronize=torch.cpu.synchronize,
                                ipc_collect=lambda: None,
                                empty_cache=lambda: None)
    monkeypatch.setattr(bwt, "get_torch_device", lambda: cpu)
    ctx = zmq.Context.instance()
    ctx.setsockopt(zmq.RCVTIMEO, 60000)
    ctx.setsockopt(zmq.SNDTIMEO, 60000)
    yield
    ctx.setsockopt(zmq.RCVTIMEO, -1)
    ctx.setsockopt(zmq.SNDTIMEO, -1)


def test_verl_real_three_actors_two_rollouts(tmp_path, cpu_bucket_transfer):
    cfg_path = tiny_config(tmp_path)
    key = "verl-real"
    WORLDS[key] = world = reshard.InprocWorld(A + R)
    # what the user writes (checkpoint_engine.* in verl's rollout config)
    cfg = CheckpointEngineConfig(
        backend="reshard", update_weights_bucket_megabytes=1,
        custom_backend_module="reshard.integrations.verl",
        engine_kwargs={"reshard": {"model_config_path": cfg_path,
                                   "transport": "inproc:" + key,
                                   "timeout_ms": 30000}})
    import_external_libs(cfg.custom_backend_module)
    kwargs = cfg.engine_kwargs[cfg.backend]
    bucket = cfg.update_weights_bucket_megabytes << 20
    engines = [CheckpointEngineRegistry.new(cfg.backend, is_master=(i == 0),
                                            bucket_size=bucket, **kwargs)
               for i in range(A)] + \
              [CheckpointEngineRegistry.new(cfg.backend, bucket_size=bucket,
                                            **kwargs) for _ in range(R)]
    tensors = engines[0].model.tensors()
    try:
        for step in range(2):
            metadata = [e.prepare() for e in engines]
            actor_kw, rollout_kw = type(engines[0]).build_topology(A, R, metadata)
            kws = [{k: v[i] for k, v in actor_kw.items()} for i in range(A)] + \
                  [{k: v[i] for k, v in rollout_kw.items()} for i in range(R)]
            run_threads([lambda e=e, kw=kw: e.init_process_group(**kw)
                         for e, kw in zip(engines, kws)])
            got = [dict() for _ in range(R)]
            kinds = set()
            handles = ["ipc://%s/zmq-%s.sock" % (tmp_path, uuid.uuid4().hex)
                       for _ in range(R)]

            def send(e, seed, step=step):
                # the actor's per-tensor generator (torch, in its own order)
                order = np.random.default_rng(seed).permutation(len(tensors))
                gen = ((tensors[i].name, full(tensors[i], step)) for i in order)
                asyncio.run(e.send_weights(gen, global_steps=step))

            def rollout(e, handle, step=step):
                # the vLLM server adapter's path: the engine's generator
                # straight into verl's bucketed sender
                async def tap():
                    async for name, t in e.receive_weights(global_steps=step):
                        kinds.add(type(t))
                        yield name, t
                asyncio.run(BucketedWeightSender(
                    handle, bucket_size_mb=1, use_shm=True).async_send_weights(tap()))

            def worker(handle, out):
                # vLLM's side of verl's bucketed transfer
                def on_bucket(weights, is_last):
                    for name, t in weights:
                        out[name] = t.clone()
                BucketedWeightReceiver(handle, torch.device("cpu"),
                                       use_shm=True).receive_weights(on_bucket)

            run_threads([lambda e=e, i=i: send(e, 100 * step + i)
                         for i, e in enumerate(engines[:A])] +
                        [lambda e=e, h=h: rollout(e, h)
                         for e, h in zip(engines[A:], handles)] +
                        [lambda h=h, o=o: worker(h, o)
                         for h, o in zip(handles, got)])
            for e in engines:
                e.finalize()
            assert kinds == {torch.Tensor}, kinds
            for r, out in enumerate(got):
                assert sorted(out) == sorted(t.name for t in tensors), r
                for t in tensors:
                    want = full(t, step)
                    assert out[t.name].dtype == want.dtype, (step, r, t.name)
                    assert torch.equal(out[t.name].view(torch.uint8),
                                       want.view(torch.uint8)), (step, r, t.name)
        # every actor worker sent a share of the bytes
        for e in engines[:A]:
            assert sum(p.stats().send_bytes for p in e.plans) > 0
    finally:
        for e in engines:
            e.close()
        world.close()
        del WORLDS[key]


def test_master_address_is_routable():
    """prepare() announces the address verl's own NCCL engine would
    (ray.util.get_node_ip_address), not the hostname's loopback."""
    import ray
    from reshard.integrations.verl import _routable_address
    assert _routable_address() == ray.util.get_node_ip_address().strip("[]")
