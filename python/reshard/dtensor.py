"""Layouts read from a live torch module: FSDP2, HSDP and DTensor tensor
parallelism (issue 41).

Every rank builds the same global layout from its own parameters, with no
collective: a DTensor carries its global shape, dtype, device mesh (the
global ranks of every position) and placements on every rank. Each
parameter becomes one buffer named as ``named_parameters()`` names it
(torch's wrapper infixes removed, see WRAPPERS), holding the rank's local
tensor (``to_local()``), dense and row-major.

Placements (torch/distributed/tensor/placement_types.py):

- ``Shard(d)``: torch.chunk along d (the last pieces smaller or empty),
  reshard's Shard(d); axes apply in mesh order, a later axis splitting an
  earlier one's piece, as DTensor's left-to-right convention does.
- ``Replicate()``: reshard's Replicate(); HSDP is (Replicate(), Shard(0)).
- ``_StridedShard(d, split_factor=sf)``: FSDP2 on top of tensor
  parallelism. FSDP2 chunks each rank's *local* TP shard over its
  data-parallel axis (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
  FSDPParam._init_sharded_param: ``_chunk_with_empty(param_data, ...)`` of
  the local tensor, and ``split_factor`` = the product of the sizes of the
  later mesh axes that shard the same dim). The data is a shard of a
  shard, the later axes' split first: reshard models it by moving the
  strided axis after those axes, each Shard splitting the previous piece.
  When the sizes do not divide evenly, torch's own reading of the
  placement (``_StridedShard._split_tensor``, and with it
  ``compute_local_shape_and_global_offset``) puts some rows on other ranks
  than FSDP2 stores them (e.g. 7 rows over tp 2 x dp 3: FSDP2 keeps row 6
  on (dp 2, tp 1), torch's metadata says (dp 2, tp 0)). reshard follows
  the data; every rank checks that its local tensor has the shape the
  layout gives it and refuses otherwise.
- ``Partial``: a pending reduction, not yet a value; refused.

Plain (non-DTensor) parameters are replicated over ``replicas``.

Ranks without the module (the inference side of a sync) build the same
layout from the trainer's description: ``describe(module)`` on a trainer
rank gives plain picklable ParamSpecs, which the framework sends the way
it sends anything (torch.distributed.broadcast_object_list, Ray, MPI), and
``layout(specs)`` builds the Layout from them anywhere.
"""
from dataclasses import dataclass
from typing import Tuple

from . import dtypes as _dt
from .errors import InvalidArgumentError, UnsupportedError
from .layout import Layout, Replicate, Shard

#: Module-name segments torch's wrappers insert, removed from parameter
#: names: activation checkpointing (torch/distributed/algorithms/
#: _checkpoint/checkpoint_wrapper.py _CHECKPOINT_PREFIX), torch.compile
#: (torch/_dynamo/eval_frame.py OptimizedModule._orig_mod) and FSDP1
#: (torch/distributed/fsdp/_common_utils.py FSDP_WRAPPED_MODULE).
WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _name(name, strip):
    for s in strip:
        name = name.replace(s, "")
    return name


def _named(module, buffers, strip):
    """(name, tensor) of the module's parameters (and buffers), each once,
    under its stripped name; two tensors under one name are an error."""
    items = list(module.named_parameters())
    if buffers:
        items += list(module.named_buffers())
    out, seen = [], {}
    for raw, t in items:
        n = _name(raw, strip)
        if n in seen:
            raise InvalidArgumentError(
                "from_module: parameters %r and %r are both named %r once "
                "the wrapper segments %r are removed" % (seen[n], raw, n,
                                                         tuple(strip)))
        seen[n] = raw
        out.append((n, t))
    return out


def _is_dtensor(t):
    return type(t).__name__ == "DTensor" and hasattr(t, "placements")


def _axes(name, placements, sizes):
    """(axis order, reshard placements in that order) of a DTensor's
    placements over a mesh of ``sizes``; raises for what reshard does not
    model."""
    kinds = [type(p).__name__ for p in placements]
    for i, (p, k) in enumerate(zip(placements, kinds)):
        if k == "Partial" or (hasattr(p, "is_partial") and p.is_partial()):
            raise UnsupportedError(
                "from_module: parameter %r: mesh axis %d holds %r, a pending "
                "reduction (the sum of the ranks' values, not a value): "
                "reduce it first (DTensor.redistribute to Replicate() or "
                "Shard)" % (name, i, p))
        if k not in ("Shard", "Replicate", "_StridedShard"):
            raise UnsupportedError(
                "from_module: parameter %r: mesh axis %d holds %r; reshard "
                "models Shard, Replicate and FSDP2's _StridedShard"
                % (name, i, p))
    order = list(range(len(placements)))
    for i in reversed(range(len(placements))):
        if kinds[i] != "_StridedShard":
            continue
        d, sf = placements[i].dim, int(placements[i].split_factor)
        later = [j for j in range(i + 1, len(placements))
                 if kinds[j] in ("Shard", "_StridedShard")
                 and placements[j].dim == d]
        prod = 1
        for j in later:
            prod *= sizes[j]
        if not later or prod != sf:
            raise UnsupportedError(
                "from_module: parameter %r: mesh axis %d holds %r, but the "
                "later axes sharding dim %d have %d ranks in all: reshard "
                "models _StridedShard as FSDP2 makes it (split_factor = "
                "the ranks of the later axes sharding the same dim)"
                % (name, i, placements[i], d, prod))
        order.remove(i)
        order.insert(max(order.index(j) for j in later) + 1, i)
    pls = [Replicate() if kinds[a] == "Replicate" else Shard(placements[a].dim)
           for a in order]
    return order, pls


def _global_grid(name, dm):
    """(grid of torch ranks, number of the DTensor's own mesh axes) of the
    mesh a DTensor's placements extend to on every rank. A DTensor on a
    sub-mesh (FSDP2's data-parallel slice for the parameters tensor
    parallelism leaves alone, e.g. norms under TP x FSDP2: mesh["dp"]) knows
    only its own slice, which differs from rank to rank; its root mesh
    (DeviceMesh._get_root_mesh, the mesh init_device_mesh built) is the
    same everywhere, and the parameter is replicated over the root axes the
    slice does not span. The grid's axes are the sub-mesh's (each the root
    axes it spans, flattened row-major as DeviceMesh._flatten does) and
    then the other root axes."""
    sub = dm.mesh
    root = dm._get_root_mesh() if hasattr(dm, "_get_root_mesh") else None
    if root is None or root.mesh.numel() == sub.numel():
        return sub, sub.dim()
    R = root.mesh
    coords = {}
    for flat, r in enumerate(R.reshape(-1).tolist()):
        c, rest = [], flat
        for n in reversed(R.shape):
            c.append(rest % n)
            rest //= n
        coords[r] = tuple(reversed(c))
    first = sub.reshape(-1)[0].item()
    spans = []
    for k in range(sub.dim()):
        if sub.shape[k] == 1:
            spans.append([])
            continue
        idx = [0] * sub.dim()
        idx[k] = 1
        nxt = coords[sub[tuple(idx)].item()]
        spans.append([d for d in range(R.dim()) if nxt[d] != coords[first][d]])
    covered = [d for span in spans for d in span]
    others = [d for d in range(R.dim()) if d not in covered]
    grid = R.permute(*(covered + others)).reshape(
        list(sub.shape) + [R.shape[d] for d in others])
    here = grid[(slice(None),) * sub.dim() +
                tuple(coords[first][d] for d in others)]
    if len(set(covered)) != len(covered) or not bool((here == sub).all()):
        raise UnsupportedError(
            "from_module: parameter %r: its mesh %r is not a slice of its "
            "root mesh %r that reshard can extend to every rank"
            % (name, sub.tolist(), R.tolist()))
    return grid, sub.dim()


def _world():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
    except ImportError:
        pass
    return 1, 0


@dataclass(frozen=True)
class ParamSpec:
    """One parameter as reshard places it, torch-free and picklable: its
    name, reshard dtype name and global shape, the mesh in reshard's axis
    order (sizes, and the torch global rank of each position, row-major)
    with one placement per axis, and the local shape of the describing
    rank (None where that rank is outside the mesh)."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    mesh: Tuple[int, ...]
    ranks: Tuple[int, ...]
    placements: tuple
    local_shape: object = None


def spec(name, t, replicas=None, dtype=None):
    """The ParamSpec of one tensor ``t`` under ``name``: a DTensor (its
    global shape, mesh and placements), a plain tensor (replicated over
    ``replicas``, default every torch rank), or a placement record with
    ``full_shape``, ``mesh`` and ``placements`` such as verl's ShardSpec
    (verl/workers/engine/spec.py; mesh None: unsharded), which needs
    ``dtype`` (reshard's dtype name; for a tensor it overrides the
    tensor's). Raises as describe does."""
    if replicas is None:
        replicas = tuple(range(_world()[0]))
    if _is_dtensor(t):
        shape, dm, placements = t.shape, t.device_mesh, t.placements
        local = tuple(t.to_local().shape) if dm.get_coordinate() is not None \
            else None
    elif hasattr(t, "full_shape"):
        if dtype is None:
            raise InvalidArgumentError("dtensor.spec: parameter %r: a placement "
                                       "record needs dtype" % (name,))
        shape, dm, placements, local = t.full_shape, t.mesh, t.placements, None
    else:
        shape, dm, placements, local = t.shape, None, None, tuple(t.shape)
    if dtype is None:
        dtype = _dt.name(_dt.to_c(t.dtype))
    if dm is None:
        mesh, ranks, pls = (len(replicas),), tuple(replicas), (Replicate(),)
    else:
        # torch ranks, one per mesh position; Replicate on root axes
        # beyond the DTensor's own
        grid, own = _global_grid(name, dm)
        sizes = list(grid.shape)
        order, pls = _axes(name, list(placements) + [
            Replicate()] * (grid.dim() - own), sizes)
        mesh = tuple(sizes[a] for a in order)
        ranks = tuple(grid.permute(*order).reshape(-1).tolist())
    return ParamSpec(name, dtype, tuple(int(x) for x in shape), mesh, ranks,
                     tuple(pls), local)


def describe(module, buffers=False, replicas=None, strip=WRAPPERS):
    """The ParamSpec of each of ``module``'s parameters (and buffers), in
    named_parameters() order; see from_module for the arguments. Raises
    UnsupportedError for a Partial or a _StridedShard FSDP2 does not make,
    InvalidArgumentError for two parameters under one name."""
    world, _ = _world()
    plain = tuple(range(world)) if replicas is None else tuple(int(r) for r in replicas)
    return [spec(name, t, plain) for name, t in _named(module, buffers, strip)]


def layout(specs, first_rank=0, ranks=None, into=None):
    """The Layout of ParamSpecs (describe's): one tensor and one buffer,
    named as the parameter, per spec. ranks: reshard's rank of each torch
    global rank (indexed by torch rank); default first_rank + torch rank.
    into: add to this Layout instead of a new one."""
    def rank_of(t, name):
        if ranks is None:
            return first_rank + t
        if not 0 <= t < len(ranks):
            raise InvalidArgumentError(
                "dtensor.layout: parameter %r: torch rank %d has no reshard "
                "rank (ranks maps %d torch ranks)" % (name, t, len(ranks)))
        return int(ranks[t])

    L = into if into is not None else Layout()
    meshes = {}
    for s in specs:
        key = (s.mesh, s.ranks)
        if key not in meshes:
            meshes[key] = L.add_mesh(s.mesh, ranks=[rank_of(t, s.name)
                                                    for t in s.ranks])
        tid = L.add_tensor(s.name, s.dtype, s.shape)
        L.place(tid, meshes[key], list(s.placements), name=s.name)
    return L


def from_module(module, first_rank=0, ranks=None, replicas=None,
                buffers=False, strip=WRAPPERS, into=None):
    """The layout of ``module``'s parameters as they lie on the trainer's
    ranks (see this module's docstring); the same on every rank, with no
    collective.

    first_rank / ranks: reshard's rank of each torch global rank (ranks: a
    sequence indexed by torch rank; default first_rank + torch rank).
    replicas: the torch ranks that hold plain (non-DTensor) parameters,
    default every rank of the default process group. buffers: declare
    named_buffers() too. strip: the name segments to remove (WRAPPERS).
    into: add to this Layout instead of a new one. Raises UnsupportedError
    for a Partial or a _StridedShard that FSDP2 does not make, and
    InvalidArgumentError for a name clash or a local tensor whose shape is
    not the one the layout gives this rank."""
    specs = describe(module, buffers, replicas, strip)
    L = layout(specs, first_rank, ranks, into)
    _, me = _world()
    if ranks is None or me < len(ranks):
        _check_local(L, first_rank + me if ranks is None else int(ranks[me]),
                     specs)
    return L


def _check_local(L, rank, specs):
    """This rank's local tensors have the shapes the layout gives them:
    a placement read differently from the data would move wrong rows."""
    boxes = {L.buffer_name(f.buffer): f.shape for f in L.fragments(rank)}
    for s in specs:
        if s.local_shape is None:
            continue
        want = boxes.get(s.name)
        numel = 1
        for n in s.local_shape:
            numel *= n
        if want is None and numel == 0:
            continue
        if want != s.local_shape:
            raise InvalidArgumentError(
                "from_module: parameter %r on reshard rank %d: the local "
                "tensor is %s, the layout gives this rank %s (placements %r "
                "over mesh %r of torch ranks %r)" % (
                    s.name, rank, s.local_shape, want, s.placements, s.mesh,
                    s.ranks))


def local_tensors(module, buffers=False, strip=WRAPPERS):
    """{name: this rank's local tensor} of the module's parameters, under
    from_module's names, empty local shards left out (the rank holds
    nothing of them): the source buffers of a plan whose source layout
    from_module made. No copy: the tensors FSDP2 keeps."""
    out = {}
    for name, t in _named(module, buffers, strip):
        local = t.to_local() if _is_dtensor(t) else t
        if local.numel():
            out[name] = local
    return out
