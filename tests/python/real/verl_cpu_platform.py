"""A host ("cpu") accelerator platform for verl, so verl's own code runs on
a machine without a GPU. STAND-IN: verl 0.9.1 ships CUDA, NPU and ROCm
platforms only, and falls back to CUDA where none is found (whose
torch.cuda.synchronize() fails without a driver).

Registered through verl's own extension point for new hardware
(verl/plugin/platform/platform_manager.py: PlatformRegistry.register,
selected with VERL_PLATFORM=cpu), imported in every process by
VERL_USE_EXTERNAL_MODULES=verl_cpu_platform (verl/__init__.py, with this
folder on PYTHONPATH) before anything asks get_platform().

The platform says: device "cpu", no CUDA IPC (so verl's vLLM server
adapter moves weights through shared memory, its path for devices
without IPC), collectives over gloo; synchronize and the cache calls are
no-ops (host memory).
"""
import contextlib
import types

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _noop(*_a, **_k):
    return None


# what verl calls on get_torch_device() (torch.cuda's names)
DEVICE_MODULE = types.SimpleNamespace(
    is_available=lambda: True, synchronize=_noop, empty_cache=_noop,
    ipc_collect=_noop, memory_reserved=lambda *_a: 0,
    memory_allocated=lambda *_a: 0, max_memory_allocated=lambda *_a: 0,
    max_memory_reserved=lambda *_a: 0, reset_peak_memory_stats=_noop,
    mem_get_info=lambda *_a: (0, 0), current_device=lambda: 0,
    device_count=lambda: 1, set_device=_noop, manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed, Stream=None,
    current_stream=lambda *_a: None)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self):
        return "cpu"

    @property
    def vendor_name(self):
        return "cpu"

    @property
    def device_module(self):
        return DEVICE_MODULE

    def is_available(self):
        return True

    def current_device(self):
        return 0

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg):
        yield

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass

    def ray_resource_name(self):
        return "CPU"

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def cudart(self):
        return None
