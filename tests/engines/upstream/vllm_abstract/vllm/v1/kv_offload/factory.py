# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/factory.py of the releases:
create_spec(vllm_config, kv_cache_config) finds the spec by spec_name and
spec_module_path, asserts issubclass(spec_cls, OffloadingSpec) and calls
spec_cls(vllm_config, kv_cache_config). Written for kvshare's tests."""
import importlib

from vllm.v1.kv_offload.spec import OffloadingSpec


class OffloadingSpecFactory:
    _registry = {}

    @classmethod
    def create_spec(cls, config, kv_cache_config):
        extra_config = config.kv_transfer_config.kv_connector_extra_config
        spec_name = extra_config.get("spec_name", "CPUOffloadingSpec")
        if spec_name in cls._registry:
            spec_cls = cls._registry[spec_name]()
        else:
            spec_module_path = extra_config.get("spec_module_path")
            if spec_module_path is None:
                raise ValueError("Unsupported spec type: %s" % spec_name)
            spec_cls = getattr(importlib.import_module(spec_module_path), spec_name)
        assert issubclass(spec_cls, OffloadingSpec)
        return spec_cls(config, kv_cache_config)
