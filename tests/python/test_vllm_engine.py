"""reshard's vLLM weight-transfer engine through the real vLLM 0.33
interface (vllm.distributed.weight_transfer: the real factories,
WeightTransferEngine and ModuleSource), with in-process ranks: trainer
engines on 4 trainer threads (Megatron tp=2,pp=2), worker engines on 4
vLLM worker threads (tp=2,dp=2), one in-process world; every parameter
byte checked after each step. The workers' models are plain parameter
holders (FakeModule): tests/python/real/vllm_world.py runs vLLM's own
model classes. Skipped without vLLM (the default test environment has
none; scripts/test_real.sh installs it)."""
import os
import types
from dataclasses import dataclass

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm", reason="the real vLLM: bash scripts/test_real.sh")
torch = pytest.importorskip("torch")
from vllm.distributed.weight_transfer.base import ModuleSource  # noqa: E402
from vllm.distributed.weight_transfer.factory import (  # noqa: E402
    WeightTransferEngineFactory, WeightTransferTrainerFactory)

import reshard  # noqa: E402
from reshard.integrations import vllm as rvllm  # noqa: E402
from conftest import run_threads  # noqa: E402
from frameworks import (FakeModule, params_for, tiny_config,  # noqa: E402
                        wrong_bytes)

rvllm.register()
rvllm.register()  # idempotent


@pytest.fixture(autouse=True)
def no_accelerator(monkeypatch):
    # WeightTransferEngine.update_weights ends with
    # torch.accelerator.synchronize(); PyPI's torch is CUDA's build, which
    # raises without a driver, and there is nothing to synchronize here
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **k: None)


@dataclass
class WeightTransferConfig:
    backend: str = "nccl"


class Client:
    """The inference side's control plane (VLLMWeightSyncClient): each
    call reaches every worker, as vLLM's collective_rpc does."""

    def __init__(self, engines):
        self.engines = engines
        self.calls = []

    def init_weight_transfer_engine(self, init_info):
        self.calls.append("init")
        run_threads([lambda e=e: e.init_transfer_engine(e.parse_init_info(init_info))
                 for e in self.engines])

    def start_weight_update(self):
        self.calls.append("start")
        for e in self.engines:
            e.start_weight_update()

    def update_weights(self, update_info):
        self.calls.append("update %d" % update_info["version"])
        run_threads([lambda e=e: e.update_weights(update_info) for e in self.engines])

    def finish_weight_update(self, weight_version=None):
        self.calls.append("finish")
        for e in self.engines:
            e.finish_weight_update()


def worker_engine(dst, rank, dp_index, rank_in_dp):
    pc = types.SimpleNamespace(data_parallel_index=dp_index, world_size=2,
                               rank=rank_in_dp)
    vc = types.SimpleNamespace(parallel_config=pc, model_config=None)
    model = FakeModule(params_for(dst, rank))
    e = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig("reshard"), vc, "cpu", model)
    assert isinstance(e, rvllm.ReshardWeightTransferEngine)
    return e, model


def test_vllm_engine_end_to_end(tmp_path):
    cfg = tiny_config(tmp_path)
    train, infer = "tp=2,pp=2", "tp=2,dp=2"
    world = reshard.InprocWorld(8)
    rvllm.WORLDS["e2e"] = world
    dst = reshard.models.vllm_layout(cfg, infer, first_rank=4)
    src = reshard.models.megatron_layout(cfg, train)
    # vLLM worker (dp_index, parallel_config.rank) -> reshard rank 4 + ...
    workers = [worker_engine(dst, 4 + dp * 2 + r, dp, r)
               for dp in range(2) for r in range(2)]
    client = Client([e for e, _ in workers])
    trainer_params = [params_for(src, r, step=0) for r in range(4)]
    engines = [None] * 4

    def init(r):
        info = rvllm.ReshardTrainerInitInfo(
            model_config_path=cfg, train=train, infer=infer, world_size=8,
            transport="inproc:e2e", timeout_ms=30000, rank=r)
        source = ModuleSource(FakeModule(trainer_params[r], prefix="module."))
        engines[r] = WeightTransferTrainerFactory.trainer_init(
            info, client=client, source=source)
    run_threads([lambda r=r: init(r) for r in range(4)])
    for step in range(3):
        if step:
            for r in range(4):  # the optimizer step, in place
                fresh = params_for(src, r, step=step)
                for n, t in trainer_params[r].items():
                    t.bytes[:] = fresh[n].bytes
        run_threads([e.send_weights for e in engines])
        for (e, model), rank in zip(workers, (4, 5, 6, 7)):
            assert wrong_bytes(dst, rank, dict(model._p), step) == 0, (step, rank)
    assert client.calls == ["init"] + ["start", "update 1", "finish",
                                       "start", "update 2", "finish",
                                       "start", "update 3", "finish"]
    for e in engines:
        e.shutdown()
    for e, _ in workers:
        e.shutdown()
    world.close()
    del rvllm.WORLDS["e2e"]


def test_vllm_engine_worker_refusal_reaches_the_trainer(tmp_path):
    # Qwen3-MoE's routed experts (w13/w2): a worker whose live module
    # cannot be read (here: a model without vLLM's modules) or whose MoE
    # backend rewrites them refuses at its init, before its plan; the
    # trainer's plan creation then fails at its deadline and the sender
    # re-raises the worker's error, which names the parameter. Nothing
    # hangs and no engine keeps a plan.
    from conftest import ROOT
    cfg = os.path.join(ROOT, "configs", "Qwen3-30B-A3B.json")
    world = reshard.InprocWorld(2)
    rvllm.WORLDS["moe"] = world
    dst = reshard.models.vllm_layout(cfg, "tp=1", first_rank=1, layers=1)
    e, _ = worker_engine(dst, 1, 0, 0)
    client = Client([e])
    info = rvllm.ReshardTrainerInitInfo(
        model_config_path=cfg, train="tp=1", infer="tp=1", world_size=2,
        transport="inproc:moe", layers=1, timeout_ms=3000, rank=0)
    with pytest.raises(reshard.UnsupportedError, match="w13_weight"):
        WeightTransferTrainerFactory.trainer_init(
            info, client=client, source=ModuleSource(FakeModule({})))
    assert client.calls == ["init"]
    assert e.plan is None and e.comm is None
    world.close()
    del rvllm.WORLDS["moe"]


def test_nccl_handles_accepted():
    import ctypes
    from reshard.comm import _nccl_handle

    class Pynccl:  # vLLM's PyNcclCommunicator, ctypes or nccl4py .comm
        def __init__(self, comm):
            self.comm = comm
    assert _nccl_handle(0x1234) == 0x1234
    assert _nccl_handle(ctypes.c_void_p(0x10)) == 0x10
    assert _nccl_handle(Pynccl(ctypes.c_void_p(0x20))) == 0x20
    assert _nccl_handle(Pynccl(types.SimpleNamespace(ptr=0x30))) == 0x30
    assert _nccl_handle(types.SimpleNamespace(ptr=0x40)) == 0x40
    with pytest.raises(reshard.InvalidArgumentError, match="NULL"):
        _nccl_handle(ctypes.c_void_p(None))
    with pytest.raises(reshard.InvalidArgumentError, match="not an NCCL"):
        _nccl_handle("comm")


@pytest.mark.skipif(not reshard.HAVE_UCX, reason="needs a reshard built with UCX")
def test_ucx_cuda_transport_refused_and_port_freed():
    """The adapters' "ucx_cuda" transport on a machine without a GPU
    driver: BackendError naming the CUDA error, and the UCX communicator
    made for it is closed, so rank 0's rendezvous port is free for the
    retried init."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
    from free_port import free_port
    port = free_port()
    with pytest.raises((reshard.BackendError, reshard.UnsupportedError), match="CUDA"):
        rvllm._comm("ucx_cuda", 0, 1, "127.0.0.1", port, None)
    c = rvllm._comm("ucx", 0, 1, "127.0.0.1", port, None)
    assert (c.kind, c.rank, c.size) == ("ucx", 0, 1)
    c.close()
    with pytest.raises(reshard.InvalidArgumentError, match="needs master_address"):
        rvllm._comm("ucx_cuda", 0, 1, None, None, None)


def test_bad_transport():
    with pytest.raises(reshard.InvalidArgumentError, match="inproc:<key>"):
        rvllm._comm("tcp", 0, 1, None, None, None)
    with pytest.raises(reshard.InvalidArgumentError, match="no world"):
        rvllm._comm("inproc:nope", 0, 1, None, None, None)
