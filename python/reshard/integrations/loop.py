"""sync_weights: one call per step in a NeMo-RL / slime style loop.

    plan = reshard.Plan(comm, megatron_layout, vllm_layout)
    for step in range(steps):
        train_step(trainer_model)
        sync_weights(plan, trainer_model, infer_model, step)

Every rank calls it: a trainer rank passes its model (infer_model None),
an inference rank its engine's model (trainer_model None), a colocated
rank both. Buffers are bound from each side's named_parameters() (and
named_buffers(): Megatron's router expert_bias is a buffer) by the names
the layouts give them. Each step looks the tensors up again and compares
their data addresses with the binding's: the same, the cached binding
executes in one C call; changed (vLLM sleep/wake, load_state_dict with
assign=True, an optimizer that replaced .data), the step binds again, so
a reallocated parameter is never left stale. rebind=True forces it.

A rank given a model whose side of the plan holds nothing on it (an
inference layout built without first_rank=, say) raises
InvalidArgumentError instead of succeeding with nothing received.
"""
from ..buffers import describe
from ..errors import InvalidArgumentError


def named_tensors(model, strip_prefix=None):
    """{name: tensor} of a model: a dict as is, else named_parameters()
    plus named_buffers() of a torch module (without ``strip_prefix``, e.g.
    "module." of a DDP wrapper, at the start of each name)."""
    if model is None:
        return {}
    if isinstance(model, dict):
        out = dict(model)
    elif hasattr(model, "named_parameters"):
        out = dict(model.named_parameters())
        if hasattr(model, "named_buffers"):
            for n, b in model.named_buffers():
                out.setdefault(n, b)
    else:
        raise InvalidArgumentError("sync_weights: %r is neither a dict of "
                                   "tensors nor a module with "
                                   "named_parameters()" % type(model).__name__)
    if strip_prefix:
        out = {(n[len(strip_prefix):] if n.startswith(strip_prefix) else n): t
               for n, t in out.items()}
    return out


def _pick(plan, side, model, strip_prefix):
    want = plan.buffers(side)
    have = named_tensors(model, strip_prefix)
    # Only the names the layout gives this rank: a model also holds
    # parameters reshard does not move (frozen towers, LoRA adapters).
    # Missing ones are reported by bind, by name.
    return {n: have[n] for n in want if n in have}


def _address(t):
    """Where a tensor's data lives (what a reallocation changes)."""
    if hasattr(t, "data_ptr"):
        return t.data_ptr()
    info = describe(t)
    return None if info is None else info.ptr


def sync_weights(plan, trainer_model, infer_model, step, stream=None,
                 rebind=False, strip_prefix=None):
    """Executes ``plan`` with this rank's trainer and/or inference
    parameters, as weight version step + 1 (so a rank at another step
    fails with reshard.MismatchError instead of mixing steps). Returns
    the Bound in use."""
    for model, side, what in ((trainer_model, "src", "a trainer"),
                              (infer_model, "dst", "an inference")):
        if model is not None and not plan.buffers(side):
            e = InvalidArgumentError(
                "sync_weights, rank %d: %s model was given, but the plan's %s "
                "layout gives this rank no buffers: is that layout built for "
                "these ranks (first_rank=)?" % (
                    plan.rank, what,
                    "source" if side == "src" else "destination"))
            plan.refuse(e, int(step) + 1)
            raise e
    src = _pick(plan, "src", trainer_model, strip_prefix)
    dst = _pick(plan, "dst", infer_model, strip_prefix)
    where = [(n, _address(t)) for side in (src, dst) for n, t in side.items()]
    # The binding lives on the plan (a Bound refers to its plan weakly, so
    # this makes no cycle and dies with the plan).
    cached = getattr(plan, "_sync_weights", None)
    if (cached is None or rebind or cached[0] is not trainer_model
            or cached[1] is not infer_model or cached[3] != where):
        try:
            bound = plan.bind(src, dst)
        except InvalidArgumentError as e:
            # this step's execute is refused: its partners hear of it now
            plan.refuse(e, int(step) + 1)
            raise
        # the models are held with their binding (compared by identity),
        # and the addresses it was made with
        plan._sync_weights = (trainer_model, infer_model, bound, where)
    else:
        bound = cached[2]
    plan.execute(bound, version=int(step) + 1, stream=stream)
    return bound
