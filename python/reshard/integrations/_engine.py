"""What reshard's inference-engine adapters share: the vLLM engine
(integrations/vllm.py) and the SGLang engine (integrations/sglang.py)
check the world the same way, build the same layouts' plan, bind the
trainer's parameters the same way, refuse with the same message shape and
check the live parameters against the layout the same way. Each function
takes the engine's name for its messages ("vLLM", "SGLang")."""
import sys

import reshard
from ..errors import InvalidArgumentError, UnsupportedError


def check_world(info, ntrain, rank, engine):
    """The world must be the trainer ranks then every inference rank of
    the layout: a rank beyond the layout (a dp left out of ``infer``)
    would receive nothing and serve stale weights."""
    ninfer = reshard.models.ranks(info.infer)
    if info.world_size != ntrain + ninfer:
        raise InvalidArgumentError(
            "reshard %s engine, rank %d: world_size %d is not the %d "
            "trainer ranks (train '%s') plus the %d inference ranks (infer "
            "'%s'); give every replica in infer (dp=...)" % (
                engine, rank, info.world_size, ntrain, info.train, ninfer,
                info.infer))


def owner(model, name):
    """The live module holding parameter ``name``, or None."""
    path = name.rpartition(".")[0]
    try:
        return model.get_submodule(path)
    except (AttributeError, TypeError):
        return None


def written(dst, rank):
    """{name: (bytes, torch dtype)} of this rank's destination buffers."""
    import torch
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
           "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
    dtype = {dst.buffer_name(f.buffer): f.dtype for f in dst.fragments(rank)}
    return {n: (dst.buffer_bytes(b, rank), tdt.get(dtype.get(n)))
            for n, b in dst.buffers(rank).items()}


def size_refusals(live, written_, skip, rank, engine, why):
    """{name: why} for the parameters written directly whose live tensor
    is not the layout's size or dtype (``live``: the model's
    named_parameters() as a dict; ``skip``: names handled otherwise; a
    missing parameter is left to the binding, which names it). ``why``:
    the engine's likely cause, appended."""
    out = {}
    for n, (nb, dt) in written_.items():
        p = live.get(n)
        if n in skip or p is None:
            continue
        if p.numel() * p.element_size() != nb or (
                dt is not None and isinstance(p.dtype, type(dt)) and
                p.dtype != dt):
            out[n] = ("%s holds it as %s %s (%d bytes), reshard's layout says "
                      "%s (%d bytes) on rank %d: %s" % (
                          engine, tuple(getattr(p, "shape", ())), p.dtype,
                          p.numel() * p.element_size(), dt, nb, rank, why))
    return out


def refuse(flagged, rank, engine):
    """Raises UnsupportedError naming the first refused parameter, why,
    and up to three more."""
    names = sorted(flagged)
    raise UnsupportedError(
        "reshard %s engine, rank %d: %d parameters are served in a format "
        "other than the one reshard writes: %s: %s%s" % (
            engine, rank, len(names), names[0], flagged[names[0]],
            "; also " + ", ".join(names[1:4]) +
            (", ..." if len(names) > 4 else "") if len(names) > 1 else ""))


def strip(name, prefix):
    """name without any number of leading ``prefix`` (Megatron's DDP and
    Float16Module wrappers each add one "module.")."""
    while prefix and name.startswith(prefix):
        name = name[len(prefix):]
    return name


def make_plan(comm, info, src, dst):
    """The adapters' plan over ``comm``; a creation that fails closes
    ``comm`` first (a UCX rank 0 holds the rendezvous port while its
    communicator lives, so a retried init could not listen there)."""
    try:
        return reshard.Plan(comm, src, dst, staging_bytes=info.staging_bytes,
                            timeout_ms=info.timeout_ms, topology=info.topology)
    except BaseException:
        comm.close()
        raise


def stream(comm):
    """The current CUDA stream for a device communicator, else None."""
    if not comm.device:
        return None
    torch = sys.modules.get("torch")
    return torch.cuda.current_stream() if torch is not None else None
