# SPDX-License-Identifier: Apache-2.0
"""Test mirror of SGLang's python/sglang/srt/mem_cache/hicache_storage.py
(sgl-project/sglang, read at commit 001067fffe33): HiCacheStorageConfig and
HiCacheStorageExtraInfo with upstream's fields, STORAGE_BATCH_SIZE, and
HiCacheStorage with its abstract methods (get, batch_get, set, batch_set,
exists), the v1 batch methods that raise NotImplementedError unless a
backend overrides them, and the defaults of batch_exists, clear and
get_stats. Written for kvshare's tests; the v2 pool-transfer interface and
the file backend are left out."""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional

STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(self, keys: List[str], host_indices,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None):
        pass

    @abstractmethod
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None):
        pass

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def exists(self, key: str) -> bool:
        pass

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None
