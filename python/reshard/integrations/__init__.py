"""Adapters between reshard and RL frameworks. Each is thin: it finds the
framework's parameters by name and calls reshard.Plan; the layouts come
from reshard.models (parameter names as the frameworks give them).

- loop.sync_weights: a plain helper for NeMo-RL / slime style loops.
- vllm: a vLLM weight-transfer engine, backend "reshard" (needs vLLM;
  import reshard.integrations.vllm and call register()).
- verl: a verl checkpoint engine, backend "reshard" (needs verl; import
  reshard.integrations.verl, which registers it).
"""
from ._transport import WORLDS
from .loop import named_tensors, sync_weights

__all__ = ["WORLDS", "named_tensors", "sync_weights"]
