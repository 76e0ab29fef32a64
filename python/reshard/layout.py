"""Layouts: one side's description (reshard.h, "Layouts").

Every rank builds the same two layouts, the global picture; the plan
checks by digest that all agree. A Layout wraps a reshard_layout_t: the
methods are the C functions of the same names, with ids returned instead
of written through pointers, tensors given by id or by name, and errors
raised (reshard.InvalidArgumentError naming the tensor, mesh and field).
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ._reshard_cffi import ffi, lib
from . import dtypes as _dt
from ._life import Node
from .errors import InvalidArgumentError, check


class Shard:
    """Shard(dim): the mesh axis splits tensor dim ``dim`` with torch.chunk
    semantics; Shard(dim, sizes=[...]): into the given sizes, one per rank
    of the axis, summing to the extent."""

    __slots__ = ("dim", "sizes")

    def __init__(self, dim, sizes=None):
        self.dim = int(dim)
        self.sizes = None if sizes is None else [int(s) for s in sizes]

    def __repr__(self):
        return ("Shard(%d)" % self.dim if self.sizes is None
                else "Shard(%d, sizes=%r)" % (self.dim, self.sizes))

    def __eq__(self, other):
        return (isinstance(other, Shard) and other.dim == self.dim
                and other.sizes == self.sizes)

    def __hash__(self):
        return hash((self.dim, tuple(self.sizes or ())))


class Replicate:
    """Every rank of the mesh axis holds the same piece."""

    __slots__ = ()

    def __repr__(self):
        return "Replicate()"

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")


def placement(p, what="placement"):
    """reshard.Shard / Replicate from ours or from torch DTensor placement
    objects (torch.distributed.tensor.Shard(dim) / Replicate(); matched by
    class name, so torch need not be imported). DTensor's Partial (a
    pending reduction) and _StridedShard have no reshard equivalent."""
    if isinstance(p, (Shard, Replicate)):
        return p
    kind = type(p).__name__
    if kind == "Replicate":
        return Replicate()
    if kind == "Shard" and isinstance(getattr(p, "dim", None), int):
        return Shard(p.dim)
    raise InvalidArgumentError(
        "%s: %r is not a placement (reshard.Shard(dim), reshard.Shard(dim, "
        "sizes=[...]), reshard.Replicate(), or DTensor's Shard / Replicate; "
        "Partial and _StridedShard have no reshard equivalent)" % (what, p))


class _Keep:
    """cffi objects that must outlive one C call."""

    def __init__(self):
        self.objs = []

    def new(self, ctype, init=None):
        o = ffi.new(ctype, init)
        self.objs.append(o)
        return o

    def placements(self, placements, what, mesh_shape):
        # C reads one placement per mesh axis and one size per rank of a
        # Shard(dim, sizes)'s axis: lengths checked here, or C would read
        # past the arrays
        pls = [placement(p, "%s[%d]" % (what, i))
               for i, p in enumerate(placements)]
        if len(pls) != len(mesh_shape):
            raise InvalidArgumentError(
                "%s: %d placements for a mesh of %d axes %r (one per axis)"
                % (what, len(pls), len(mesh_shape), tuple(mesh_shape)))
        for i, p in enumerate(pls):
            if isinstance(p, Shard) and p.sizes is not None and \
                    len(p.sizes) != mesh_shape[i]:
                raise InvalidArgumentError(
                    "%s[%d]: Shard(%d, sizes=...) has %d sizes, the mesh "
                    "axis %d ranks" % (what, i, p.dim, len(p.sizes),
                                       mesh_shape[i]))
        arr = self.new("reshard_placement_t[]", max(len(pls), 1))
        for i, p in enumerate(pls):
            if isinstance(p, Shard):
                arr[i].kind = lib.RESHARD_PLACEMENT_SHARD
                arr[i].dim = p.dim
                arr[i].split_sizes = (ffi.NULL if p.sizes is None
                                      else self.new("int64_t[]", p.sizes))
            else:
                arr[i].kind = lib.RESHARD_PLACEMENT_REPLICATE
                arr[i].dim = 0
                arr[i].split_sizes = ffi.NULL
        return arr

    def int64s(self, values, ndim=None, what=None):
        """int64_t[] of values (NULL for None); with ndim, exactly ndim of
        them (C reads one per tensor dim)."""
        if values is None:
            return ffi.NULL
        values = [int(v) for v in values]
        if ndim is not None and len(values) != ndim:
            raise InvalidArgumentError("%s: %d values for a tensor of %d dims"
                                       % (what, len(values), ndim))
        return self.new("int64_t[]", values or [0])


@dataclass(frozen=True)
class TensorInfo:
    """A logical tensor: its id, name, dtype name and global shape."""
    id: int
    name: str
    dtype: str
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class Fragment:
    """A box of a tensor inside a rank's buffer (reshard_fragment_info_t):
    ``box`` is [(lo, hi), ...] in global coordinates, ``offset`` the byte
    offset of its first element in the buffer, ``strides`` in elements."""
    buffer: int
    name: str
    tensor: int
    dtype: str
    box: Tuple[Tuple[int, int], ...]
    offset: int
    strides: Tuple[int, ...]

    @property
    def shape(self):
        return tuple(hi - lo for lo, hi in self.box)


@dataclass
class Part:
    """One tensor's share of a fused buffer (reshard_part_t), for
    Layout.add_fused: the tensor (id or name), its own mesh and placements,
    optionally the padded shape the placements split, and for a windowed
    part (reshard_layout_add_windows) the window's origin."""
    tensor: object
    mesh: int
    placements: Sequence
    padded_shape: Optional[Sequence[int]] = None
    origin: Optional[Sequence[int]] = None


class Layout(Node):
    """One side of a reshard: tensors, meshes and the buffers holding them.

    >>> L = reshard.Layout()
    >>> w = L.add_tensor("w", "bf16", (1024, 512))
    >>> m = L.add_mesh((4,), start=0)
    >>> L.place(w, m, [reshard.Shard(0)])        # buffer id
    """

    def __init__(self):
        p = ffi.new("reshard_layout_t **")
        check(lib.reshard_layout_create(p))
        self._live(p[0], lib.reshard_layout_destroy, None, "reshard.Layout")

    @classmethod
    def _adopt(cls, handle):
        """Wraps a reshard_layout_t this object then owns (model layouts)."""
        self = cls.__new__(cls)
        self._live(handle, lib.reshard_layout_destroy, None, "reshard.Layout")
        return self

    # ---------------------------------------------------------- tensors
    def add_tensor(self, name, dtype, shape, block=None):
        """Declares a logical tensor; returns its id.

        ``block=(rows, cols)`` (with dtype ``"fp8e4m3"``) declares a weight
        quantized in blocks, as fp8 checkpoints and vLLM's block-fp8 layers
        hold it, and also its f32 scale tensor ``<name>_scale_inv`` (one
        scale per block of the last two dims; its id from
        ``tensor_id(name + "_scale_inv")``), to be placed like any tensor.
        A destination declared so, whose source holds the weight in bf16,
        f16 or f32, is quantized on the way (reshard_layout_add_tensor_blocked
        in reshard.h says how, exactly)."""
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        out = ffi.new("int *")
        arr = ffi.new("int64_t[]", list(shape) or [0])
        cdt = _dt.to_c(dtype, "tensor %r: dtype" % name)
        if block is None:
            check(lib.reshard_layout_add_tensor(
                self.handle, name.encode(), cdt, len(shape), arr, out))
        else:
            blk = tuple(int(b) for b in block)
            if len(blk) != 2:
                raise ValueError("tensor %r: block must be (rows, cols), not %r" % (name, block))
            check(lib.reshard_layout_add_tensor_blocked(
                self.handle, name.encode(), cdt, len(shape), arr,
                ffi.new("int64_t[2]", list(blk)), out))
        return out[0]

    def tensor_block(self, tensor):
        """``((rows, cols), scale_id)`` of a weight declared with ``block=``,
        ``None`` for any other tensor."""
        blk = ffi.new("int64_t[2]")
        sid = ffi.new("int *")
        check(lib.reshard_layout_tensor_block(self.handle, self._tid(tensor), blk, sid))
        return ((blk[0], blk[1]), sid[0]) if blk[0] else None

    def tensor_id(self, name):
        """The id of the tensor named ``name``."""
        out = ffi.new("int *")
        check(lib.reshard_layout_find_tensor(self.handle, name.encode(), out))
        return out[0]

    def _tid(self, tensor):
        return self.tensor_id(tensor) if isinstance(tensor, str) else int(tensor)

    def allow_partial(self, tensor):
        """Lets this side hold only part (or none) of a tensor."""
        check(lib.reshard_layout_allow_partial(self.handle, self._tid(tensor)))

    @property
    def num_tensors(self):
        return lib.reshard_layout_num_tensors(self.handle)

    def tensor(self, tensor):
        """TensorInfo of a tensor (id or name)."""
        tid = self._tid(tensor)
        name = ffi.new("const char **")
        dtype = ffi.new("reshard_dtype_t *")
        ndim = ffi.new("int *")
        shape = ffi.new("int64_t[8]")
        check(lib.reshard_layout_tensor_info(self.handle, tid, name, dtype,
                                             ndim, shape))
        return TensorInfo(tid, ffi.string(name[0]).decode(),
                          _dt.name(dtype[0]), tuple(shape[0:ndim[0]]))

    def tensors(self):
        """Every tensor's TensorInfo, in id order."""
        return [self.tensor(t) for t in range(self.num_tensors)]

    @classmethod
    def from_module(cls, module, first_rank=0, ranks=None, replicas=None,
                    buffers=False):
        """The layout of a live torch module's parameters: FSDP2, HSDP and
        DTensor tensor parallelism read from each DTensor's mesh and
        placements, plain parameters replicated (reshard.dtensor.from_module,
        whose docstring says what each placement means)."""
        from .dtensor import from_module
        return from_module(module, first_rank=first_rank, ranks=ranks,
                           replicas=replicas, buffers=buffers, into=None)

    # ----------------------------------------------------------- meshes
    def add_mesh(self, shape, ranks=None, start=0, stride=1):
        """A grid of ranks (row-major, last axis fastest): ``ranks`` lists
        them, else start, start + stride, ...; returns the mesh id."""
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        cs = ffi.new("int[]", list(shape) or [0])
        out = ffi.new("int *")
        if ranks is None:
            check(lib.reshard_layout_add_mesh_strided(
                self.handle, len(shape), cs, int(start), int(stride), out))
        else:
            cr = ffi.new("int[]", [int(r) for r in ranks] or [0])
            n = 1
            for s in shape:
                n *= s
            if len(ranks) != n:
                raise InvalidArgumentError(
                    "add_mesh: ranks has %d entries, the mesh %r has %d "
                    "positions" % (len(ranks), shape, n))
            check(lib.reshard_layout_add_mesh(self.handle, len(shape), cs, cr,
                                              out))
        return out[0]

    def mesh_shape(self, mesh):
        ndim = ffi.new("int *")
        shape = ffi.new("int[8]")
        check(lib.reshard_layout_mesh_shape(self.handle, int(mesh), ndim, shape))
        return tuple(shape[0:ndim[0]])

    # ---------------------------------------------------------- buffers
    def place(self, tensor, mesh, placements, name=None):
        """Each rank of the mesh holds its piece of the tensor in a dense
        buffer of its own; one placement per mesh axis. Returns the buffer
        id; the buffer is named ``name`` (default: the tensor's name)."""
        keep = _Keep()
        tid = self._tid(tensor)
        pls = keep.placements(placements, "place(%r): placements" % (tensor,),
                              self.mesh_shape(mesh))
        out = ffi.new("int *")
        check(lib.reshard_layout_place_named(
            self.handle, ffi.NULL if name is None else name.encode(), tid,
            int(mesh), pls, out))
        return out[0]

    def add_fused(self, name, parts, concat_dim=0, num_groups=1):
        """A buffer holding several tensors' pieces concatenated along
        ``concat_dim`` (reshard_layout_add_fused; num_groups > 1 interleaves
        per group, as Megatron's fused QKV). Parts with an ``origin`` make
        it reshard_layout_add_windows (num_groups must then be 1)."""
        keep = _Keep()
        parts = [p if isinstance(p, Part) else Part(*p) for p in parts]
        cparts = keep.new("reshard_part_t[]", max(len(parts), 1))
        ndims = []
        for i, p in enumerate(parts):
            what = "add_fused(%r): part %d" % (name, i)
            cparts[i].tensor_id = tid = self._tid(p.tensor)
            ndims.append(len(self.tensor(tid).shape))
            cparts[i].mesh_id = int(p.mesh)
            cparts[i].placements = keep.placements(
                p.placements, what + " placements", self.mesh_shape(p.mesh))
            cparts[i].padded_shape = keep.int64s(p.padded_shape, ndims[-1],
                                                 what + " padded_shape")
        out = ffi.new("int *")
        if any(p.origin is not None for p in parts):
            if num_groups != 1:
                raise InvalidArgumentError(
                    "add_fused(%r): windowed parts (origin) need num_groups "
                    "1, not %d" % (name, num_groups))
            origins = keep.new("int64_t *[]", max(len(parts), 1))
            for i, p in enumerate(parts):
                origins[i] = keep.int64s(p.origin, ndims[i],
                                         "add_fused(%r): part %d origin" % (name, i))
            check(lib.reshard_layout_add_windows(
                self.handle, name.encode(), int(concat_dim), len(parts),
                cparts, origins, out))
        else:
            check(lib.reshard_layout_add_fused(
                self.handle, name.encode(), int(concat_dim), int(num_groups),
                len(parts), cparts, out))
        return out[0]

    def _attention(self, q, k, v, num_heads, num_kv_heads, head_dim):
        a = ffi.new("reshard_attention_t *")
        a.q, a.k, a.v = self._tid(q), self._tid(k), self._tid(v)
        a.num_heads, a.num_kv_heads = int(num_heads), int(num_kv_heads)
        a.head_dim = int(head_dim)
        return a

    def add_megatron_qkv(self, name, q, k, v, num_heads, num_kv_heads,
                         head_dim, mesh, tp_axis):
        """Megatron-core's fused linear_qkv (reshard_layout_add_megatron_qkv)."""
        out = ffi.new("int *")
        check(lib.reshard_layout_add_megatron_qkv(
            self.handle, name.encode(),
            self._attention(q, k, v, num_heads, num_kv_heads, head_dim),
            int(mesh), int(tp_axis), out))
        return out[0]

    def add_vllm_qkv(self, name, q, k, v, num_heads, num_kv_heads, head_dim,
                     mesh, tp_axis):
        """vLLM's qkv_proj (reshard_layout_add_vllm_qkv)."""
        out = ffi.new("int *")
        check(lib.reshard_layout_add_vllm_qkv(
            self.handle, name.encode(),
            self._attention(q, k, v, num_heads, num_kv_heads, head_dim),
            int(mesh), int(tp_axis), out))
        return out[0]

    def add_gate_up(self, name, gate, up, mesh, tp_axis):
        """[gate shard; up shard] (reshard_layout_add_gate_up)."""
        out = ffi.new("int *")
        check(lib.reshard_layout_add_gate_up(
            self.handle, name.encode(), self._tid(gate), self._tid(up),
            int(mesh), int(tp_axis), out))
        return out[0]

    def add_buffer(self, name, rank, nbytes):
        """A raw buffer of ``nbytes`` on one rank, for add_fragment."""
        out = ffi.new("int *")
        check(lib.reshard_layout_add_buffer(self.handle, name.encode(),
                                            int(rank), int(nbytes), out))
        return out[0]

    def add_fragment(self, tensor, buffer, start, extent, offset=0,
                     strides=None):
        """The box [start, start + extent) of a tensor at byte ``offset`` of
        a raw buffer, with element ``strides`` (None: dense row-major)."""
        keep = _Keep()
        f = keep.new("reshard_fragment_t *")
        f.tensor_id = tid = self._tid(tensor)
        nd = len(self.tensor(tid).shape)
        what = "add_fragment(tensor %r, buffer %d)" % (tensor, int(buffer))
        f.buffer_id = int(buffer)
        f.start = keep.int64s(start, nd, what + ": start")
        f.extent = keep.int64s(extent, nd, what + ": extent")
        f.byte_offset = int(offset)
        f.strides = keep.int64s(strides, nd, what + ": strides")
        check(lib.reshard_layout_add_fragment(self.handle, f))

    @property
    def num_buffers(self):
        """The number of buffer ids (0 .. num_buffers - 1)."""
        return lib.reshard_layout_num_buffers(self.handle)

    def buffer_name(self, buffer):
        out = ffi.new("const char **")
        check(lib.reshard_layout_buffer_name(self.handle, int(buffer), out))
        return ffi.string(out[0]).decode()

    def buffer_id(self, name, rank=-1):
        """The buffer named ``name`` that ``rank`` holds (rank < 0: the only
        buffer of that name)."""
        out = ffi.new("int *")
        check(lib.reshard_layout_find_buffer(self.handle, name.encode(),
                                             int(rank), out))
        return out[0]

    def buffer_bytes(self, buffer, rank):
        """Bytes of the buffer on ``rank`` (0: the rank holds none of it)."""
        out = ffi.new("size_t *")
        check(lib.reshard_layout_buffer_bytes(self.handle, int(buffer),
                                              int(rank), out))
        return int(out[0])

    def buffers(self, rank):
        """{name: buffer id} of the buffers ``rank`` holds (names are unique
        per rank: the model front-end names them as the framework names its
        parameters on that rank)."""
        out = {}
        nb = ffi.new("size_t *")
        name = ffi.new("const char **")
        h = self.handle
        for b in range(lib.reshard_layout_num_buffers(h)):
            check(lib.reshard_layout_buffer_bytes(h, b, int(rank), nb))
            if nb[0]:
                check(lib.reshard_layout_buffer_name(h, b, name))
                out[ffi.string(name[0]).decode()] = b
        return out

    def fragments(self, rank):
        """The fragments ``rank`` holds, in canonical order (buffer, then
        position in the buffer); empty ones omitted."""
        count = ffi.new("size_t *")
        check(lib.reshard_layout_fragments(self.handle, int(rank), ffi.NULL,
                                           0, count))
        n = count[0]
        arr = ffi.new("reshard_fragment_info_t[]", max(n, 1))
        check(lib.reshard_layout_fragments(self.handle, int(rank), arr, n,
                                           count))
        infos = {}
        out = []
        for i in range(n):
            f = arr[i]
            t = infos.get(f.tensor_id)
            if t is None:
                t = infos[f.tensor_id] = self.tensor(f.tensor_id)
            nd = f.ndim
            out.append(Fragment(
                buffer=f.buffer_id, name=t.name, tensor=f.tensor_id,
                dtype=t.dtype,
                box=tuple((f.start[d], f.start[d] + f.extent[d])
                          for d in range(nd)),
                offset=int(f.byte_offset), strides=tuple(f.strides[0:nd])))
        return out
