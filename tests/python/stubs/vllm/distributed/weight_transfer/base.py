"""Stand-in of vllm/distributed/weight_transfer/base.py (vLLM 0.33): the
classes and signatures reshard's adapter uses. update_weights omits the
upstream torch.accelerator.synchronize() (no torch here)."""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class WeightTransferInitInfo(ABC):  # noqa: B024
    pass


@dataclass
class WeightTransferUpdateInfo(ABC):  # noqa: B024
    pass


@dataclass
class TrainerInitInfo:
    backend: ClassVar[str]
    rank: int = field(kw_only=True)

    @property
    def is_sender(self):
        return self.rank == 0


class WeightTransferEngine(ABC):
    init_info_cls: type
    update_info_cls: type
    supports_draft_weight_update: bool = True
    defers_processing: bool = False

    def __init__(self, config, vllm_config, device, model):
        self.config = config
        self.vllm_config = vllm_config
        self.parallel_config = vllm_config.parallel_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.model = model

    def parse_init_info(self, init_dict: dict[str, Any]):
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError(f"Invalid init_info: {e}") from e

    def parse_update_info(self, update_dict: dict[str, Any]):
        try:
            return self.update_info_cls(**update_dict)
        except TypeError as e:
            raise ValueError(f"Invalid update_info: {e}") from e

    @abstractmethod
    def init_transfer_engine(self, init_info) -> None: ...

    @abstractmethod
    def start_weight_update(self) -> None: ...

    @abstractmethod
    def finish_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    @abstractmethod
    def receive_weights(self, update_info) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...


class WeightSource(ABC):
    def iter_local(self):
        raise NotImplementedError


class ModuleSource(WeightSource):
    def __init__(self, module):
        self._module = module

    def iter_local(self):
        yield from self._module.named_parameters()


class TrainerWeightTransferEngine(ABC):
    init_info_cls: type

    def __init__(self, *, client, source=None, is_sender=True, rank=0):
        self.is_sender = is_sender
        self.rank = rank
        self.client = client
        self.source = source

    @classmethod
    @abstractmethod
    def trainer_init(cls, init_info, *, client, source=None): ...

    @abstractmethod
    def send_weights(self) -> None: ...

    def shutdown(self) -> None:
        pass
