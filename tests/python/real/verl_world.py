"""One job against the real verl 0.9.1 and Ray: reshard's verl checkpoint
engine between 3 actor workers and 2 rollout workers (2 rollout replicas
of tp 1), driven by verl's own CheckpointEngineManager over 2 steps, the
actor's weights changing between them.

    VLLM_TARGET_DEVICE=cpu python verl_world.py --out DIR     # the driver

The driver is the trainer process: it starts a local Ray cluster, an MPI
job of 5 worker processes (mpirun: ranks 0-2 actor workers, 3-4 rollout
workers; transport "mpi", reshard's host transport between processes)
and runs verl's CheckpointEngineManager.update_weights for each step.
Checks print "FAIL ..." lines; the last line is "N passed, M failed".

Real verl, unmodified:
  - the config: verl's own ppo_trainer.yaml composed by Hydra with the
    overrides shown in reshard.integrations.verl's docstring (read from
    it), then omega_conf_to_dataclass as verl does;
  - plugin import and registry: custom_backend_module through
    import_external_libs, CheckpointEngineRegistry.new with
    engine_kwargs["reshard"], in the worker constructors themselves;
  - the driver side: CheckpointEngineManager (update_weights: abort,
    release_kv_cache, build_process_group, the concurrent update_weights of
    both groups, finalize, resume), RayWorkerGroup (its DP_COMPUTE and
    ONE_TO_ALL dispatch over Ray, ray.get), vLLMReplica (its
    abort_all_requests / release_kv_cache / resume_* calls on its servers);
  - the actor side: ActorRolloutRefWorker(role="actor") built by its own
    __init__ and init_model (which builds verl's TrainingWorker and the
    checkpoint engine), its update_weights (get_per_tensor_param ->
    checkpoint_engine.send_weights) and execute_checkpoint_engine;
  - the rollout side: CheckpointEngineWorker built by its own __init__
    (which builds verl's vLLM ServerAdapter, get_rollout_class("vllm",
    "async")), its update_weights: receive_weights -> ServerAdapter.
    update_weights -> collective_rpc("update_weights_from_ipc") on the
    server actor it looks up by name, and verl's BucketedWeightSender
    (shared-memory mode: the path for devices without CUDA IPC) ->
    BucketedWeightReceiver.

STAND-INS (each where the real thing cannot run here), and why:
  - RankProxy: the Ray actor of each worker. verl's workers are Ray
    actors; reshard's only transport between processes without GPUs is
    MPI, and a Ray actor process cannot join an MPI job, so each worker
    lives in an MPI rank and its Ray actor forwards the manager's calls to
    it (ZMQ, with a deadline). With GPUs the workers are the Ray actors
    themselves (transport nccl).
  - VllmServerStandIn: vLLM's server actor (vLLMHttpServer, a live vLLM
    on GPUs). It answers the replica's and the adapter's calls and, for
    collective_rpc("update_weights_from_ipc"), does what verl's vLLM
    worker extension does with the buckets (BucketedWeightReceiver, the
    real one), keeping the tensors instead of loading them into a model.
  - StandInEngine: the training engine behind verl's TrainingWorker
    (FSDP / Megatron need GPUs), registered through verl's own
    EngineRegistry for device "cpu". It yields full tensors by HF name
    (the names of transformers' own LlamaForCausalLM for the config, an
    independent source), values from global coordinates, a new version
    per training step, in a different order on each rank and step.
  - verl_cpu_platform: a host accelerator platform (see that module).
  - The default process group of each side is formed here, with gloo,
    before verl's worker constructors run: TrainingWorker asks for
    "cpu:gloo,<device>:<backend>", which names cpu twice on a host
    platform, and torch refuses that.

Every wait has a deadline: the control messages (ZMQ), ray.get in the
driver, reshard's own timeout, and a watchdog that ends the whole job.
"""
import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/python: conftest helpers
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "support"))
from free_port import free_port  # noqa: E402

A, R = 3, 2
NAMESPACE = "reshard-verl-world"
CTL_DEADLINE_S = 300      # one control message (the longest: first import)
WORLD_DEADLINE_S = 540    # the whole job (the watchdog)

# A small Llama: ~3.4 MB of bf16 weights, several reshard plans of <= 1 MB
# (verl's smallest bucket: update_weights_bucket_megabytes=1).
MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2,
    "vocab_size": 1000, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
}


def host_env():
    """What every process of the job needs in its environment."""
    path = [HERE] + [os.path.abspath(p) for p in
                     os.environ.get("PYTHONPATH", "").split(":") if p]
    return {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "verl_cpu_platform",
            "PYTHONPATH": ":".join(path), "VLLM_TARGET_DEVICE": "cpu",
            "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0",
            "TOKENIZERS_PARALLELISM": "false"}


def doc_overrides(model_json):
    """The Hydra overrides reshard.integrations.verl's docstring shows."""
    import reshard.integrations.verl as rverl
    out = [m.group(1).replace("/path/config.json", model_json)
           for m in re.finditer(r"^    (\+?actor_rollout_ref\.[\w.]+=\S+)$",
                                rverl.__doc__, re.M)]
    assert out, "no overrides in reshard.integrations.verl's docstring"
    return out


def compose(out_dir):
    """verl's ppo_trainer config with the docstring's overrides and this
    job's (model, tp 1, 1 MB buckets, transport mpi)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    import verl
    model_dir = os.path.join(out_dir, "model")
    overrides = doc_overrides(os.path.join(model_dir, "config.json")) + [
        "actor_rollout_ref.model.path=" + model_dir,
        "+actor_rollout_ref.model.load_tokenizer=False",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.transport=mpi",
        "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.timeout_ms=60000",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    ]
    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        return hcompose(config_name="ppo_trainer", overrides=overrides)


def hf_tensors(model_dir):
    """(name, shape) of every tensor of transformers' own model class for
    the config, in its state_dict order (what verl's FSDP engine yields)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    return [(n, tuple(t.shape)) for n, t in m.state_dict().items()]


def full(name, shape, version):
    """The whole tensor at a weight version, bf16, from global coordinates
    (conftest.values: an expectation independent of reshard)."""
    import numpy as np
    import torch
    from conftest import values
    n = int(np.prod(shape))
    b = values(zlib.crc32(name.encode()) + 1000 * version,
               np.arange(n, dtype=np.int64), 2)
    return torch.frombuffer(bytearray(b.tobytes()), dtype=torch.uint8).view(
        torch.bfloat16).reshape(shape)


# ------------------------------------------------------------ stand-ins
class RankProxy:
    """STAND-IN for a worker's Ray actor (see the module docstring): the
    methods the manager calls through RayWorkerGroup, forwarded to the MPI
    rank that holds the real worker."""

    def __init__(self, path, deadline_s):
        import zmq
        self.path = path
        self.sock = zmq.Context().socket(zmq.REQ)
        self.sock.setsockopt(zmq.RCVTIMEO, int(deadline_s * 1000))
        self.sock.setsockopt(zmq.SNDTIMEO, int(deadline_s * 1000))
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(path)

    def _call(self, kind, name, args, kwargs):
        import zmq
        try:
            self.sock.send_pyobj((kind, name, args, kwargs))
            status, value = self.sock.recv_pyobj()
        except zmq.Again:
            raise TimeoutError("%s: no answer to %s within the deadline"
                               % (self.path, name))
        if status != "ok":
            raise RuntimeError("%s, %s:\n%s" % (self.path, name, value))
        return value

    def execute_checkpoint_engine(self, method, *args, **kwargs):
        return self._call("worker", "execute_checkpoint_engine",
                          (method,) + args, kwargs)

    def update_weights(self, *args, **kwargs):
        return self._call("worker", "update_weights", args, kwargs)

    def harness(self, name, *args):
        return self._call("harness", name, args, {})


class VllmServerStandIn:
    """STAND-IN for vLLM's server actor (vLLMHttpServer; see the module
    docstring): the calls vLLMReplica and verl's vLLM ServerAdapter make,
    and the worker extension's receive (verl's BucketedWeightReceiver)."""

    def __init__(self, zmq_handle, deadline_s):
        import zmq
        ctx = zmq.Context.instance()  # the receiver's: give it deadlines
        ctx.setsockopt(zmq.RCVTIMEO, int(deadline_s * 1000))
        ctx.setsockopt(zmq.SNDTIMEO, int(deadline_s * 1000))
        self.zmq_handle, self.events, self.weights, self.steps = \
            zmq_handle, [], {}, None

    def abort_all_requests(self, reset_prefix_cache=True, reject_request=False):
        self.events.append("abort_all_requests")
        return {"aborted_count": 0, "request_ids": []}

    def wait_for_requests_to_drain(self):
        self.events.append("wait_for_requests_to_drain")

    def release_kv_cache(self):
        self.events.append("release_kv_cache")

    def resume_kv_cache(self):
        self.events.append("resume_kv_cache")

    def resume_engine_generation(self):
        self.events.append("resume_engine_generation")

    def open_submission_gate(self):
        self.events.append("open_submission_gate")

    def clear_kv_cache(self):
        self.events.append("clear_kv_cache")

    def set_global_steps(self, global_steps):
        self.steps = global_steps

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        import torch
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer \
            import BucketedWeightReceiver
        assert method == "update_weights_from_ipc", method
        self.events.append(method)

        def on_bucket(weights, is_last):  # where vLLM would load_weights
            for name, t in weights:
                assert name not in self.weights, name
                self.weights[name] = t.clone()
        BucketedWeightReceiver(self.zmq_handle, torch.device("cpu"),
                               use_shm=(kwargs or {}).get("use_shm", False)
                               ).receive_weights(on_bucket)

    def take(self):
        out = (self.weights, self.events, self.steps)
        self.weights, self.events, self.steps = {}, [], None
        return out


def register_stand_in_engine(strategy):
    """STAND-IN for the training engine (see the module docstring),
    through verl's EngineRegistry for device "cpu"."""
    from verl.workers.engine.base import BaseEngine, EngineRegistry

    @EngineRegistry.register(model_type="language_model", backend=strategy,
                             device="cpu")
    class StandInEngine(BaseEngine):
        def __init__(self, model_config, **_):
            import torch.distributed as dist
            self.rank = dist.get_rank()
            self.model_dir = model_config.local_path
            self.version = 0  # a training step moves it (harness "train")

        def initialize(self):
            self.tensors = hf_tensors(self.model_dir)

        @property
        def is_param_offload_enabled(self):
            return False

        @property
        def is_optimizer_offload_enabled(self):
            return False

        def get_data_parallel_rank(self):
            return self.rank

        def is_mp_src_rank_with_outputs(self):
            return True

        def get_per_tensor_param(self, **_):
            import numpy as np
            order = np.random.default_rng(
                100 * self.version + self.rank).permutation(len(self.tensors))
            v = self.version
            gen = ((self.tensors[i][0], full(*self.tensors[i], v)) for i in order)
            return gen, None
    return StandInEngine


# --------------------------------------------------------------- ranks
def rank_main(args):
    from mpi4py import MPI
    import zmq
    rank = MPI.COMM_WORLD.rank
    assert MPI.COMM_WORLD.size == A + R
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.setsockopt(zmq.RCVTIMEO, CTL_DEADLINE_S * 1000)
    rep.setsockopt(zmq.LINGER, 0)
    rep.bind(ctl_path(args.out, rank))
    worker, init_error = None, None
    try:
        worker = build_worker(args, rank)
    except Exception:  # told to the driver (a signal ends the rank)
        init_error = traceback.format_exc()
    try:
        while True:
            try:
                kind, name, a, k = rep.recv_pyobj()
            except zmq.Again:
                print("rank %d: no control message within %d s" % (rank, CTL_DEADLINE_S),
                      flush=True)
                return 1
            if init_error is not None:
                rep.send_pyobj(("err", "rank %d could not start:\n%s" % (rank, init_error)))
                continue
            try:
                if kind == "harness":
                    value = harness(worker, rank, name, *a)
                else:
                    value = getattr(worker, name)(*a, **k)
                    if asyncio.iscoroutine(value):
                        value = asyncio.run(value)
                rep.send_pyobj(("ok", value))
            except Exception:  # to the driver, through the proxy
                rep.send_pyobj(("err", traceback.format_exc()))
            if kind == "harness" and name == "exit":
                return 0
    finally:
        if worker is not None:
            worker.checkpoint_engine.close()
        rep.close()
        import ray
        ray.shutdown()


def harness(worker, rank, name, *args):
    """The harness's own messages (no verl call): readiness, a training
    step on the actor's stand-in engine, statistics, exit."""
    if name == "ready":
        ad = getattr(worker, "server_adapter", None)
        return {"rank": rank, "zmq_handle": ad.zmq_handle if ad else None,
                "use_shm": ad.use_shm if ad else None}
    if name == "train":
        worker.actor.engine.version += 1
        return worker.actor.engine.version
    if name == "stats":
        return {"send_bytes": sum(p.stats().send_bytes
                                  for p in worker.checkpoint_engine.plans),
                "plans": len(worker.checkpoint_engine.plans),
                "engine": type(worker.checkpoint_engine).__name__}
    if name == "exit":
        return None
    raise ValueError(name)


def build_worker(args, rank):
    import ray
    ray.init(address=args.gcs, namespace=NAMESPACE, log_to_driver=False,
             logging_level="WARNING")
    cfg = compose(args.out)
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.distributed import initialize_global_process_group_ray
    role_rank, size, port = ((rank, A, args.actor_port) if rank < A
                             else (rank - A, R, args.rollout_port))
    os.environ.update(RANK=str(role_rank), WORLD_SIZE=str(size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      RAY_LOCAL_WORLD_SIZE="1")
    # the side's default group, gloo (see the module docstring)
    initialize_global_process_group_ray(timeout_second=120, backend="cpu:gloo")
    if rank < A:
        from verl.workers.engine_workers import ActorRolloutRefWorker
        register_stand_in_engine(cfg.actor_rollout_ref.actor.strategy)
        w = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
        w.init_model()
        return w
    from verl.checkpoint_engine.base import CheckpointEngineWorker
    import zmq
    ctx = zmq.Context.instance()  # verl's bucketed sender's: deadlines
    ctx.setsockopt(zmq.RCVTIMEO, CTL_DEADLINE_S * 1000)
    ctx.setsockopt(zmq.SNDTIMEO, CTL_DEADLINE_S * 1000)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    # as vLLMReplica.get_ray_class_with_init_args passes them
    return CheckpointEngineWorker(rollout_config=rollout, model_config=model,
                                  replica_rank=rank - A)


def ctl_path(out, rank):
    return "ipc://%s/ctl-%d.sock" % (out, rank)


# -------------------------------------------------------------- driver
class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL " + what, flush=True)


def stop(p):
    """Ends the MPI job: SIGTERM (mpirun passes it on and cleans up), then
    SIGKILL; each with a deadline."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            pass


def driver_main(args):
    os.environ.update(host_env())
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "model"), exist_ok=True)
    with open(os.path.join(out, "model", "config.json"), "w") as f:
        json.dump(MODEL, f)
    for r in range(A + R):
        try:
            os.remove(ctl_path(out, r)[len("ipc://"):])
        except OSError:
            pass
    deadline = float(os.environ.get("RESHARD_VERL_WORLD_DEADLINE_S", WORLD_DEADLINE_S))
    job = [None]

    def watchdog():
        print("FAIL the job ran past %.0f s" % deadline, flush=True)
        stop(job[0])
        import ray
        t = threading.Thread(target=ray.shutdown, daemon=True)
        t.start()
        t.join(30)  # Ray's processes (its agents outlive a bare exit)
        os._exit(124)
    timer = threading.Timer(deadline, watchdog)
    timer.daemon = True
    timer.start()

    import ray
    t0 = time.time()
    checks = Checks()
    # a cluster of its own (address="local"), whose processes share this
    # one's fate
    ray.init(address="local", namespace=NAMESPACE, num_cpus=16,
             object_store_memory=128 << 20, include_dashboard=False,
             logging_level="WARNING")
    log = open(os.path.join(out, "ranks.log"), "w")
    try:
        job[0] = subprocess.Popen(
            ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
             # shared-memory segments in out/, not /dev/shm (a killed job
             # leaves them behind)
             "--mca", "btl_vader_backing_directory", out,
             "-n", str(A + R), sys.executable, os.path.abspath(__file__),
             "--rank", "--out", out, "--gcs", ray.get_runtime_context().gcs_address,
             "--actor-port", str(free_port()), "--rollout-port", str(free_port())],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with open(os.path.join(out, "mpirun.pid"), "w") as f:
            f.write(str(job[0].pid))  # test_verl_real.py's last resort
        run(out, checks)
        try:
            rc = job[0].wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc = "still running after 120 s"
        checks(rc == 0, "the MPI job exited with %s" % rc)
    except BaseException:
        traceback.print_exc()
        checks(False, "the driver raised")
    finally:
        stop(job[0])
        log.close()
        if checks.failed:
            with open(os.path.join(out, "ranks.log")) as f:
                sys.stdout.write("# ranks.log (tail):\n" + f.read()[-8000:])
        ray.shutdown()
        timer.cancel()
    print("# %.0f s" % (time.time() - t0))
    print("%d passed, %d failed" % (checks.passed, checks.failed), flush=True)
    return 1 if checks.failed else 0


def run(out, check):
    import ray
    import torch
    from verl.checkpoint_engine.base import CheckpointEngineManager
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    cfg = compose(out)
    ce = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine)
    check(ce.backend == "reshard" and
          ce.custom_backend_module == "reshard.integrations.verl" and
          ce.engine_kwargs["reshard"]["model_config_path"].endswith("config.json"),
          "the docstring's overrides: %r" % (ce,))
    proxy_cls = ray.remote(num_cpus=0)(RankProxy)
    proxies = [proxy_cls.remote(ctl_path(out, r), CTL_DEADLINE_S)
               for r in range(A + R)]
    ready = ray.get([p.harness.remote("ready") for p in proxies],
                    timeout=CTL_DEADLINE_S + 30)
    for r in range(A, A + R):
        check(ready[r]["use_shm"] is True, "rank %d: verl's adapter should "
              "pick shared memory on a device without IPC" % r)
    stats = ray.get([p.harness.remote("stats") for p in proxies[:A]], timeout=60)
    check(all(s["engine"] == "ReshardCheckpointEngine" for s in stats),
          "actor engines: %r" % stats)

    # vLLM's server actors, by the name verl's ServerAdapter looks up
    server_cls = ray.remote(num_cpus=0)(VllmServerStandIn)
    servers = [server_cls.options(name="vllm_server_%d_0" % j,
                                  namespace=NAMESPACE).remote(
                   ready[A + j]["zmq_handle"], CTL_DEADLINE_S)
               for j in range(R)]
    replicas = []
    for j in range(R):
        rep = vLLMReplica(replica_rank=j, config=cfg.actor_rollout_ref.rollout,
                          model_config=cfg.actor_rollout_ref.model, gpus_per_node=1)
        # what launch_servers leaves (it starts vLLM on GPUs)
        rep.workers, rep.servers = [proxies[A + j]], [servers[j]]
        replicas.append(rep)
    actor_wg = RayWorkerGroup(worker_handles=proxies[:A],
                              ray_cls_with_init=RayClassWithInitArgs(
                                  cls=ray.remote(ActorRolloutRefWorker)))
    manager = CheckpointEngineManager(config=ce, actor_wg=actor_wg,
                                      replicas=replicas)

    tensors = hf_tensors(os.path.join(out, "model"))
    for step in range(2):
        if step:  # the trainer's step: new weights on every actor worker
            vs = ray.get([p.harness.remote("train") for p in proxies[:A]], timeout=60)
            check(vs == [step] * A, "train: %r" % vs)
        t = time.time()
        manager.update_weights(global_steps=step)
        print("# step %d: update_weights %.1f s" % (step, time.time() - t), flush=True)
        for j, s in enumerate(servers):
            got, events, steps = ray.get(s.take.remote(), timeout=60)
            check(steps == step, "replica %d: global_steps %r, want %d" % (j, steps, step))
            # the manager's sequence, as vLLMReplica and the adapter call it
            seq = ["abort_all_requests", "release_kv_cache",
                   "update_weights_from_ipc", "clear_kv_cache",
                   "resume_kv_cache", "open_submission_gate"]
            check([e for e in events if e in seq] == seq,
                  "replica %d: the server saw %r" % (j, events))
            check(sorted(got) == sorted(n for n, _ in tensors),
                  "replica %d step %d: names %r" % (j, step, sorted(got)))
            for name, shape in tensors:
                g = got.get(name)
                if g is None:
                    continue
                want = full(name, shape, step)
                check(isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16
                      and tuple(g.shape) == shape
                      and torch.equal(g.view(torch.uint8), want.view(torch.uint8)),
                      "replica %d step %d: %s" % (j, step, name))
    stats = ray.get([p.harness.remote("stats") for p in proxies[:A]], timeout=60)
    for r, s in enumerate(stats):
        check(s["send_bytes"] > 0 and s["plans"] > 1,
              "actor %d: every actor worker sends a share: %r" % (r, s))
    ray.get([p.harness.remote("exit") for p in proxies], timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", action="store_true", help="(internal) an MPI rank")
    ap.add_argument("--gcs")
    ap.add_argument("--actor-port", type=int)
    ap.add_argument("--rollout-port", type=int)
    args = ap.parse_args()
    if args.rank:
        sys.exit(rank_main(args))
    sys.exit(driver_main(args))


if __name__ == "__main__":
    main()
