# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/spec.py of the releases
(OffloadingSpec(vllm_config, kv_cache_config) with gpu_block_size per group
and block_size_factor, singular; no offloaded_block_size), and its abstract
get_manager and get_handlers(kv_caches, attn_backends). Written for
kvshare's tests."""
from abc import ABC, abstractmethod


class OffloadingSpec(ABC):
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        kv_transfer_config = vllm_config.kv_transfer_config
        assert kv_transfer_config is not None
        self.extra_config = kv_transfer_config.kv_connector_extra_config
        self.hash_block_size = vllm_config.cache_config.block_size
        self.gpu_block_size = tuple(g.kv_cache_spec.block_size
                                    for g in kv_cache_config.kv_cache_groups)
        for size in self.gpu_block_size:
            assert size % self.hash_block_size == 0
        self.block_size_factor = 1
        offloaded = self.extra_config.get("block_size")
        if offloaded is not None:
            sizes = set(self.gpu_block_size)
            assert len(sizes) == 1
            gpu = sizes.pop()
            assert int(offloaded) % gpu == 0
            self.block_size_factor = int(offloaded) // gpu

    @abstractmethod
    def get_manager(self):
        pass

    @abstractmethod
    def get_handlers(self, kv_caches, attn_backends):
        pass
