"""python/README.md's vLLM and verl snippets (its "vLLM and verl"
section; `<!-- readme-snippet: NAME -->` before each block), run against
the real vLLM 0.33 and verl: the launch
line through vLLM's own argument parser (`vllm serve` flags -> EngineArgs),
the trainer loop with the real factory, init info and ModuleSource. The
one stand-in: the trainer factory's trainer_init is replaced by one that
records the init info (creating the engine needs the vLLM instance on the
other side; tests/python/real/vllm_world.py runs that part)."""
import os
import re
import shlex
import types

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import pytest  # noqa: E402

pytest.importorskip("vllm", reason="the real vLLM: bash scripts/test_real.sh")
torch = pytest.importorskip("torch")

import reshard  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def snippet(name):
    text = open(os.path.join(ROOT, "python", "README.md")).read()
    m = re.search(r"<!-- readme-snippet: %s -->\s*```\w*\n(.*?)```" %
                  re.escape(name), text, re.S)
    assert m, "python/README.md has no snippet %r" % name
    return m.group(1)


def test_vllm_launch_line_parses_with_vllms_parser():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    body = snippet("vllm-install").replace("\\\n", " ")
    line = next(ln for ln in body.splitlines() if ln.startswith("vllm serve"))
    argv = shlex.split(line)[2:]
    model, flags = argv[0], argv[1:]
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", model] + flags)
    ea = AsyncEngineArgs.from_cli_args(args)
    wt = ea.weight_transfer_config
    backend = wt["backend"] if isinstance(wt, dict) else wt.backend
    assert backend == "reshard"
    assert ea.moe_backend == "triton"
    assert ea.tensor_parallel_size == 2 and ea.data_parallel_size == 2


def test_vllm_trainer_snippet_runs(monkeypatch):
    from vllm.distributed.weight_transfer import factory
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    seen = []

    class Engine:
        sent = 0

        def send_weights(self):
            Engine.sent += 1

    def trainer_init(init_info, *, client, source=None):
        seen.append((init_info, client, source))
        return Engine()
    monkeypatch.setattr(factory.WeightTransferTrainerFactory, "trainer_init",
                        staticmethod(trainer_init))
    code = snippet("vllm-trainer").replace(
        '"Qwen3-30B-A3B/config.json"',
        repr(os.path.join(ROOT, "configs", "Qwen3-30B-A3B.json")))
    ns = dict(master_ip="127.0.0.1", trainer_rank=0, client=object(),
              megatron_model=torch.nn.Linear(2, 2), steps=2,
              train_step=lambda: None)
    exec(compile(code, "python/README.md:vllm-trainer", "exec"), ns)
    assert Engine.sent == 2
    (info, client, source), = seen
    assert info.backend == "reshard" and client is ns["client"]
    assert type(source).__name__ == "ModuleSource"
    # the spec adds up and both layouts build for the panel model
    assert reshard.models.ranks(info.train) + reshard.models.ranks(info.infer) \
        == info.world_size
    from reshard.integrations.vllm import _layouts
    _layouts(types.SimpleNamespace(**{f: getattr(info, f) for f in (
        "model_config_path", "train", "infer", "layers", "dtype")}),
        reshard.models.ranks(info.train))


def test_verl_config_snippet_builds_the_engine(tmp_path):
    """python/README.md's verl YAML through verl's own config class, plugin
    import and registry: the engine it names is built with its kwargs."""
    pytest.importorskip("verl")
    yaml = pytest.importorskip("yaml")
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs
    from verl.workers.config.rollout import CheckpointEngineConfig
    doc = yaml.safe_load(snippet("verl-config"))
    ce = dict(doc["actor_rollout_ref"]["rollout"]["checkpoint_engine"])
    ce["engine_kwargs"]["reshard"]["model_config_path"] = os.path.join(
        ROOT, "configs", "Qwen3-8B.json")
    cfg = CheckpointEngineConfig(**ce)
    import_external_libs(cfg.custom_backend_module)
    e = CheckpointEngineRegistry.new(
        cfg.backend, bucket_size=cfg.update_weights_bucket_megabytes << 20,
        **cfg.engine_kwargs[cfg.backend])
    assert type(e).__name__ == "ReshardCheckpointEngine"
    assert e.options["timeout_ms"] == 60000 and e.groups
    e.close()
