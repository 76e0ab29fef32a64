"""Stand-in of verl/checkpoint_engine/base.py (verl 0.9.1): the registry
and the CheckpointEngine interface reshard's adapter implements."""
from abc import ABC, abstractmethod


class CheckpointEngineRegistry:
    _registry: dict = {}

    def register(backend: str):
        def wrapper(cls):
            CheckpointEngineRegistry._registry[backend] = cls
            return cls
        return wrapper

    @classmethod
    def get(cls, backend: str):
        if backend not in cls._registry:
            raise ValueError(f"Checkpoint engine {backend} not registered")
        return cls._registry[backend]

    @classmethod
    def new(cls, backend: str, *args, **kwargs):
        return cls.get(backend)(*args, **kwargs)


class CheckpointEngine(ABC):
    wire_format = "named_tensors"

    @abstractmethod
    def prepare(self): ...

    @classmethod
    @abstractmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list): ...

    @abstractmethod
    def init_process_group(self, **kwargs): ...

    @abstractmethod
    def finalize(self): ...

    @abstractmethod
    async def send_weights(self, weights, global_steps=None): ...

    @abstractmethod
    async def receive_weights(self, global_steps=None): ...
