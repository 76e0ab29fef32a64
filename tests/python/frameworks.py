"""Minimal stand-ins of framework objects for the adapter tests (torch,
vLLM and verl do not install here): a tensor with torch's buffer methods
over a numpy array, a module with named_parameters(), a tiny model config,
and per-rank fills and checks of parameters by their layout fragments,
with values from global coordinates (conftest.values)."""
import json

import numpy as np

import reshard
from conftest import box_linear, values

SENTINEL = 0xA5


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class FakeDevice:
    type = "cpu"


class FakeTensor:
    """torch.Tensor's buffer surface (data_ptr, is_contiguous,
    element_size, numel, dtype, device) over a numpy byte array."""

    def __init__(self, nbytes, dtype="bfloat16", esize=2):
        self.bytes = np.full(nbytes, SENTINEL, np.uint8)
        self.dtype = FakeDtype(dtype)
        self._es = esize
        self.device = FakeDevice()

    def data_ptr(self):
        return self.bytes.__array_interface__["data"][0]

    def is_contiguous(self):
        return True

    def element_size(self):
        return self._es

    def numel(self):
        return self.bytes.size // self._es


class FakeModule:
    """named_parameters() / named_buffers() as torch.nn.Module has them."""

    def __init__(self, params, buffers=None, prefix=""):
        self._p, self._b, self._prefix = params, buffers or {}, prefix

    def named_parameters(self):
        return ((self._prefix + n, t) for n, t in self._p.items())

    def named_buffers(self):
        return ((self._prefix + n, t) for n, t in self._b.items())


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
    "vocab_size": 200, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False,
}


def tiny_config(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY_LLAMA))
    return str(p)


def params_for(layout, rank, step=None):
    """{framework name: FakeTensor} of what ``rank`` holds, sized by the
    layout; with ``step``, every fragment filled with that step's values
    (tensor seed = tensor id + step)."""
    out = {}
    for name, b in layout.buffers(rank).items():
        out[name] = FakeTensor(layout.buffer_bytes(b, rank))
    if step is not None:
        for f, buf in _frags(layout, rank, out):
            buf[_positions(f)] = _want(layout, f, step)
    return out


def _frags(layout, rank, tensors):
    for f in layout.fragments(rank):
        yield f, tensors[layout.buffer_name(f.buffer)].bytes


def _positions(f):
    es = reshard.dtypes.size(reshard.dtypes.to_c(f.dtype))
    idx = np.meshgrid(*[np.arange(hi - lo) for lo, hi in f.box], indexing="ij")
    elem = sum(i.ravel() * s for i, s in zip(idx, f.strides)) + f.offset // es
    return (elem[:, None] * es + np.arange(es)).ravel()


def _want(layout, f, step):
    es = reshard.dtypes.size(reshard.dtypes.to_c(f.dtype))
    shape = layout.tensor(f.tensor).shape
    return values(f.tensor + 1000 * step, box_linear(shape, f.box), es).ravel()


def wrong_bytes(layout, rank, tensors, step):
    """Bytes differing from step's values inside fragments, plus bytes
    outside them that are no longer the sentinel."""
    bad = 0
    inside = {n: np.zeros(t.bytes.size, bool) for n, t in tensors.items()}
    for f, buf in _frags(layout, rank, tensors):
        pos = _positions(f)
        bad += int(np.count_nonzero(buf[pos] != _want(layout, f, step)))
        inside[layout.buffer_name(f.buffer)][pos] = True
    for n, t in tensors.items():
        bad += int(np.count_nonzero(t.bytes[~inside[n]] != SENTINEL))
    return bad
