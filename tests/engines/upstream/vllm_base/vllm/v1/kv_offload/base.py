# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/base.py of the base-era releases
(v0.21 to v0.25 by vLLM's docs; the shape summarised in the project's engine
notes, not re-read at a commit): OffloadKey helpers, ReqContext, the load/store
specs, PrepareStoreOutput and OffloadingEvent with the keys field names, an
OffloadingManager whose single-key lookup(key, req_context) answers
True / False / None ("retry later") and which has no on_new_request, the
canonical KV cache classes, and OffloadingSpec(vllm_config, kv_cache_config)
with abstract get_manager() and get_handlers(kv_caches). There is no
OffloadingWorker: the handler stays in worker/worker.py. Written for
kvshare's tests; abstract bodies are empty, as upstream's."""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Collection, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch


def make_offload_key(block_hash: bytes, group_idx: int) -> bytes:
    """A block hash and its KV cache group index as one key."""
    return bytes(block_hash) + group_idx.to_bytes(4, "big", signed=False)


def get_offload_block_hash(key: bytes) -> bytes:
    return key[:-4]


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Optional[Dict[str, Any]] = None


class LoadStoreSpec(ABC):
    @staticmethod
    @abstractmethod
    def medium() -> str:
        pass


@dataclass
class PrepareStoreOutput:
    keys_to_store: List[bytes]
    store_spec: LoadStoreSpec
    evicted_keys: List[bytes]


@dataclass
class OffloadingEvent:
    keys: List[bytes]
    medium: str
    removed: bool


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, key: bytes, req_context: ReqContext) -> Optional[bool]:
        pass

    @abstractmethod
    def prepare_load(self, keys: Collection[bytes], req_context: ReqContext) -> LoadStoreSpec:
        pass

    def touch(self, keys: Collection[bytes], req_context: ReqContext):
        return

    def complete_load(self, keys: Collection[bytes], req_context: ReqContext):
        return

    @abstractmethod
    def prepare_store(self, keys: Collection[bytes],
                      req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        pass

    def complete_store(self, keys: Collection[bytes], req_context: ReqContext,
                       success: bool = True):
        return

    def take_events(self) -> Iterable[OffloadingEvent]:
        return ()


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    def __init__(self, block_ids: List[int]):
        self.block_ids = np.array(block_ids, dtype=np.int64)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids: List[int], group_sizes: Sequence[int],
                 block_indices: Sequence[int]):
        super().__init__(block_ids)
        assert sum(group_sizes) == len(block_ids)
        assert len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices

    @staticmethod
    def medium() -> str:
        return "GPU"


@dataclass
class CanonicalKVCacheTensor:
    tensor: torch.Tensor
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int


@dataclass
class CanonicalKVCaches:
    tensors: List[CanonicalKVCacheTensor]
    group_data_refs: List[List[CanonicalKVCacheRef]]


class OffloadingSpec(ABC):
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        kv_transfer_config = vllm_config.kv_transfer_config
        assert kv_transfer_config is not None
        self.extra_config = kv_transfer_config.kv_connector_extra_config
        self.gpu_block_size = tuple(g.kv_cache_spec.block_size
                                    for g in kv_cache_config.kv_cache_groups)
        self.block_size_factor = 1
        offloaded = self.extra_config.get("block_size")
        if offloaded is not None:
            sizes = set(self.gpu_block_size)
            assert len(sizes) == 1
            gpu = sizes.pop()
            assert int(offloaded) % gpu == 0
            self.block_size_factor = int(offloaded) // gpu

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        pass

    @abstractmethod
    def get_handlers(self, kv_caches: CanonicalKVCaches):
        pass
