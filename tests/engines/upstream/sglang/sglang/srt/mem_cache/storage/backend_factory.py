# SPDX-License-Identifier: Apache-2.0
"""Test mirror of SGLang's python/sglang/srt/mem_cache/storage/
backend_factory.py: the "dynamic" backend (backend_name, module_path and
class_name from the extra config, the issubclass check against
HiCacheStorage, construction as backend_class(storage_config, kwargs)).
Written for kvshare's tests; the built-in backends are left out."""
import importlib
from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class StorageBackendFactory:
    _registry = {}

    @staticmethod
    def _load_backend_class(module_path, class_name, backend_name):
        module = importlib.import_module(module_path)
        backend_class = getattr(module, class_name)
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError("Backend class %s must inherit from HiCacheStorage" % class_name)
        return backend_class

    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host: Any, **kwargs):
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            return cls._create_dynamic_backend(storage_config.extra_config, storage_config,
                                               mem_pool_host, **kwargs)
        raise ValueError("Unknown storage backend '%s'. Registered backends: %s. "
                         % (backend_name, list(cls._registry)))

    @classmethod
    def _create_dynamic_backend(cls, backend_config, storage_config, mem_pool_host, **kwargs):
        for name in ("backend_name", "module_path", "class_name"):
            if name not in backend_config:
                raise ValueError("Missing required field '%s' in backend config for 'dynamic' "
                                 "backend" % name)
        backend_class = cls._load_backend_class(backend_config["module_path"],
                                                backend_config["class_name"],
                                                backend_config["backend_name"])
        return backend_class(storage_config, kwargs)
