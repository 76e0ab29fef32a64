"""Stand-in of vllm/distributed/weight_transfer/factory.py (vLLM 0.33)."""
import importlib


class _Factory:
    _registry: dict = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None):
        if name in cls._registry:
            raise ValueError(f"Weight transfer engine '{name}' is already registered.")
        if isinstance(module_path_or_cls, str):
            if class_name is None:
                raise ValueError("class_name is required when registering with module path")
            cls._registry[name] = lambda: getattr(
                importlib.import_module(module_path_or_cls), class_name)
        else:
            cls._registry[name] = lambda: module_path_or_cls


class WeightTransferEngineFactory(_Factory):
    _registry: dict = {}

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        return cls._registry[config.backend]()(config, vllm_config, device, model)


class WeightTransferTrainerFactory(_Factory):
    _registry: dict = {}

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        engine_cls = cls._registry[init_info.backend]()
        return engine_cls.trainer_init(init_info, client=client, source=source)
