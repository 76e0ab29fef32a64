"""The model front-end (reshard_models.h): a HuggingFace config.json's
logical tensors, and the Megatron-core, vLLM and SGLang layouts over them, with
each framework's parameter names as buffer names (so a rank's
``named_parameters()`` binds by name: Layout.buffers(rank)).

    src = reshard.models.megatron_layout("config.json", "tp=2,pp=2")
    dst = reshard.models.vllm_layout("config.json", "tp=2,dp=2", first_rank=4)
    dst = reshard.models.sglang_layout("config.json", "tp=8,ep=8,attn_dp=8")

Ranks are numbered as the frameworks number them (reshard_models.h,
RANKS); every rule cites its upstream source in src/models/megatron.c,
vllm.c and sglang.c.
"""
from dataclasses import dataclass
from typing import Tuple

from ._reshard_cffi import ffi, lib
from . import dtypes as _dt
from ._life import Node
from .errors import InvalidArgumentError, check
from .layout import Layout

MEGATRON = "megatron"
VLLM = "vllm"
SGLANG = "sglang"


@dataclass(frozen=True)
class ModelTensor:
    """A logical tensor of the model (HF checkpoint name)."""
    id: int
    name: str
    shape: Tuple[int, ...]
    dtype: str
    scale: int  # id of its weight_scale_inv tensor, -1 when none


class Model(Node):
    """rm_model_load_ex: a config.json read into logical tensors.
    ``layers`` > 0 keeps the real shapes but that many layers; ``dtype``
    is the weights'; ``per_expert`` lists one tensor per routed expert;
    ``block_scales`` makes the linear weights fp8 with weight_scale_inv
    tensors (needs quantization_config.weight_block_size, or ``block``,
    an (out, in) block size that overrides it). A trainer layout without
    block scales and an inference layout with them make a plan that
    quantizes on the way (bf16 training, fp8 serving)."""

    def __init__(self, config, layers=None, dtype="bf16", per_expert=False,
                 block_scales=False, block=None):
        o = ffi.new("rm_model_options *")
        o.layers = int(layers or 0)
        o.dtype = _dt.to_c(dtype, "Model: dtype")
        o.per_expert = int(bool(per_expert))
        o.block_scales = int(bool(block_scales))
        if block is not None:
            blk = tuple(int(b) for b in block)
            if len(blk) != 2 or min(blk) < 1:
                raise ValueError("Model: block must be (out, in) sizes >= 1, not %r" % (block,))
            o.block = list(blk)
        out = ffi.new("rm_model **")
        self.path = str(config)
        check(lib.rm_model_load_ex(self.path.encode(), o, out))
        self._live(out[0], lib.rm_model_free, None, "reshard.models.Model")

    @property
    def arch(self):
        return ffi.string(lib.rm_model_arch(self.handle)).decode()

    @property
    def dtype(self):
        return _dt.name(lib.rm_model_dtype(self.handle))

    @property
    def num_experts(self):
        return lib.rm_model_num_experts(self.handle)

    @property
    def layers(self):
        return lib.rm_model_layers(self.handle)

    @property
    def num_params(self):
        return int(lib.rm_model_num_params(self.handle))

    def tensors(self):
        """The logical tensors, in the layouts' tensor-id order."""
        out = []
        for i in range(lib.rm_model_num_tensors(self.handle)):
            t = lib.rm_model_tensor(self.handle, i)
            out.append(ModelTensor(i, ffi.string(t.name).decode(),
                                   tuple(t.shape[0:t.ndim]), _dt.name(t.dtype),
                                   t.scale))
        return out

    def after_load(self, framework, layout, buffer):
        """rm_after_load: None, or what the framework does to this
        parameter after loading (so writing checkpoint values into it needs
        the framework's post-load step re-run)."""
        fw = _framework(framework)
        s = lib.rm_after_load(self.handle, fw, layout.handle, int(buffer))
        return None if s == ffi.NULL else ffi.string(s).decode()


def _framework(framework):
    if framework in (MEGATRON, lib.RM_FRAMEWORK_MEGATRON):
        return lib.RM_FRAMEWORK_MEGATRON
    if framework in (VLLM, lib.RM_FRAMEWORK_VLLM):
        return lib.RM_FRAMEWORK_VLLM
    if framework in (SGLANG, lib.RM_FRAMEWORK_SGLANG):
        return lib.RM_FRAMEWORK_SGLANG
    raise InvalidArgumentError("framework %r: 'megatron', 'vllm' or 'sglang'"
                               % (framework,))


def parallel(spec):
    """rm_parse_parallel of "tp=4,pp=2" or of a dict {"tp": 4, "pp": 2};
    returns the cffi rm_parallel."""
    if isinstance(spec, dict):
        spec = ",".join("%s=%s" % (k, v) for k, v in spec.items())
    p = ffi.new("rm_parallel *")
    check(lib.rm_parse_parallel(str(spec).encode(), p))
    return p


def ranks(spec):
    """The ranks a side of this parallel spec takes: tp x pp x dp (x cp,
    Megatron), or dp_replicate x dp_shard (FSDP2)."""
    return lib.rm_parallel_ranks(parallel(spec))


def _layout(fn, config, spec, first_rank, layers, dtype, per_expert,
            block_scales, block):
    model = config if isinstance(config, Model) else Model(
        config, layers=layers, dtype=dtype, per_expert=per_expert,
        block_scales=block_scales, block=block)
    out = ffi.new("reshard_layout_t **")
    check(fn(model.handle, parallel(spec), int(first_rank), out))
    return Layout._adopt(out[0])


def megatron_layout(config, spec, first_rank=0, layers=None, dtype="bf16",
                    per_expert=False, block_scales=False, block=None):
    """rm_megatron_layout: the trainer's layout (Megatron-core, TE spec)
    over ranks first_rank .. first_rank + tp*pp*dp - 1. ``config``: a
    config.json path or a Model (whose own options then apply); ``spec``:
    "tp=2,pp=2,dp=1,ep=1,etp=...,vocab=...,first=...,last=..." or a dict."""
    return _layout(lib.rm_megatron_layout, config, spec, first_rank, layers,
                   dtype, per_expert, block_scales, block)


def vllm_layout(config, spec, first_rank=0, layers=None, dtype="bf16",
                per_expert=False, block_scales=False, block=None):
    """rm_vllm_layout: the inference engine's layout (vLLM, fused qkv_proj
    and gate_up_proj, padded vocabulary) over ranks first_rank ..
    first_rank + tp*pp*dp - 1; spec keys tp, pp, dp, ep, etp, sp_moe."""
    return _layout(lib.rm_vllm_layout, config, spec, first_rank, layers,
                   dtype, per_expert, block_scales, block)


def sglang_layout(config, spec, first_rank=0, layers=None, dtype="bf16"):
    """rm_sglang_layout: SGLang 0.5.23's layout (its named_parameters():
    qkv_proj, gate_up_proj, experts.w13_weight / w2_weight,
    fused_qkv_a_proj_with_mqa; padded vocabulary) over ranks first_rank ..
    first_rank + tp*pp*dp - 1; spec keys tp, pp, dp (replicas), ep (inside
    the TP group), attn_dp (--attn-dp-size), dp_lm_head=1
    (--enable-dp-lm-head), moe_dense_tp=1 (DeepSeek's dense layers
    replicated), shared_fusion=0 (--disable-shared-experts-fusion). What it
    does not model is refused, naming the setting (reshard_models.h)."""
    return _layout(lib.rm_sglang_layout, config, spec, first_rank, layers,
                   dtype, False, False, None)


def fsdp_layout(config, spec, first_rank=0, layers=None, dtype="bf16"):
    """rm_fsdp_layout: the layout PyTorch FSDP2 (fully_shard) gives a
    HuggingFace transformers model of the config, without torch, over
    ranks first_rank .. first_rank + dp_replicate * dp_shard - 1; spec
    keys dp_shard, dp_replicate ("dp_shard=4,dp_replicate=2": HSDP). The
    config-driven twin of Layout.from_module for planning tools and dry
    runs (dense models; tensor parallelism under FSDP2: from_module)."""
    return _layout(lib.rm_fsdp_layout, config, spec, first_rank, layers,
                   dtype, False, False, None)


def parameter_name(layout, buffer, rank):
    """rm_parameter_name: the framework's name of a buffer on a rank."""
    out = ffi.new("const char **")
    check(lib.rm_parameter_name(layout.handle, int(buffer), int(rank), out))
    return ffi.string(out[0]).decode()
