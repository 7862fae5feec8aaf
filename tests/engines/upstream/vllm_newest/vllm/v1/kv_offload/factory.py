# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/factory.py (the version with
get_spec_cls and create_spec(config: OffloadingConfig)): how vLLM finds an
out-of-tree spec (spec_name, spec_module_path), the issubclass check against
base.OffloadingSpec, and the construction spec_cls(config). Written for
kvshare's tests; the built-in registrations are left out (their modules are
not mirrored)."""
import importlib

from vllm.v1.kv_offload.base import OffloadingSpec


class OffloadingSpecFactory:
    _registry = {}

    @classmethod
    def register_spec(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError("Connector '%s' is already registered." % name)

        def loader():
            return getattr(importlib.import_module(module_path), class_name)
        cls._registry[name] = loader

    @classmethod
    def get_spec_cls(cls, extra_config):
        spec_name = extra_config.get("spec_name", "CPUOffloadingSpec")
        if spec_name in cls._registry:
            spec_cls = cls._registry[spec_name]()
        else:
            spec_module_path = extra_config.get("spec_module_path")
            if spec_module_path is None:
                raise ValueError("Unsupported spec type: %s" % spec_name)
            spec_cls = getattr(importlib.import_module(spec_module_path), spec_name)
        assert issubclass(spec_cls, OffloadingSpec)
        return spec_cls

    @classmethod
    def create_spec(cls, config):
        return cls.get_spec_cls(config.extra_config)(config)
