# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/base.py (vllm-project/vllm, read
at commit 0105e232b7fa): the names, signatures, abstract methods, dataclass
fields and enum members a spec meets, as upstream has them. Written for
kvshare's tests; method bodies are minimal (the abstract ones are empty, as
upstream's). Left out: the metric and KV-event metadata classes, TierFilter
and CopyRun/CanonicalPageMapping, which a spec does not need."""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Collection, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch

from vllm.v1.kv_offload.config import OffloadingConfig


def make_offload_key(block_hash: bytes, group_idx: int) -> bytes:
    """A block hash and its KV cache group index as one key."""
    return bytes(block_hash) + group_idx.to_bytes(4, "big", signed=False)


def get_offload_block_hash(key: bytes) -> bytes:
    return key[:-4]


def get_offload_group_idx(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


class Medium(Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Optional[Dict[str, Any]] = None
    kv_hints: Any = None


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class LoadStoreSpec:
    """Whatever a worker needs to load or store blocks."""


@dataclass
class PrepareStoreOutput:
    keys_to_store: List[bytes]
    store_spec: LoadStoreSpec
    evicted_keys: List[bytes]


@dataclass
class OffloadingEvent:
    keys: List[bytes]
    medium: Medium
    removed: bool
    locality: Optional[Locality] = None
    ownership: Optional[str] = None
    removal_expected: bool = False


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, key, req_context: ReqContext) -> LookupResult:
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

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        pass

    def on_request_finished(self, req_context: ReqContext) -> None:
        return

    def take_events(self) -> Iterable[OffloadingEvent]:
        return ()

    def on_schedule_end(self, context) -> None:
        return

    def has_pending_work(self) -> bool:
        return False

    def reset_cache(self) -> None:
        return

    def get_stats(self):
        return None

    def shutdown(self) -> None:
        return


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    def __init__(self, block_ids: List[int]):
        self.block_ids = np.array(block_ids, dtype=np.int32)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids: List[int], group_sizes: Sequence[int],
                 block_indices: Sequence[int]):
        super().__init__(block_ids)
        assert sum(group_sizes) == len(block_ids)
        assert len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices


@dataclass
class CanonicalKVCacheTensor:
    tensor: torch.Tensor
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int
    mapping: Any = None


@dataclass
class CanonicalKVCaches:
    tensors: List[CanonicalKVCacheTensor]
    group_data_refs: List[List[CanonicalKVCacheRef]]


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: Optional[int] = None
    transfer_time: Optional[float] = None


class OffloadingWorker(ABC):
    @abstractmethod
    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        """GPU -> offloaded medium, asynchronously."""

    @abstractmethod
    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        """Offloaded medium -> GPU, asynchronously."""

    @abstractmethod
    def get_finished(self) -> List[TransferResult]:
        ...

    @abstractmethod
    def wait(self, job_ids) -> None:
        ...

    def shutdown(self) -> None:
        return


@dataclass(frozen=True)
class OffloadingKVEventsConfig:
    enable_kv_cache_events: bool
    self_describing_kv_events: bool


class OffloadingSpec(ABC):
    def __init__(self, config: OffloadingConfig):
        self.config = config
        self.extra_config = config.extra_config
        self.replicated_layout = False
        self.kv_events_config = OffloadingKVEventsConfig(
            enable_kv_cache_events=config.enable_kv_cache_events,
            self_describing_kv_events=bool(self.extra_config.get("self_describing_kv_events",
                                                                 False)))
        self.offload_prompt_only = bool(self.extra_config.get("offload_prompt_only", True))
        self.max_recompute_pending_tokens = int(
            self.extra_config.get("max_recompute_pending_tokens", 0))
        self.tokens_per_block = tuple(g.tokens_per_block for g in config.groups)
        self.tokens_per_hash = config.cache.tokens_per_hash
        self.blocks_per_chunk = config.cache.blocks_per_chunk

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        pass

    @abstractmethod
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        pass
