# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/abstract.py of the releases
(v0.11-v0.12 era, vllm-project/vllm): LoadStoreSpec with its medium(),
PrepareStoreOutput and OffloadingEvent with the block_hashes field names,
and OffloadingManager with its abstract methods and signatures. Written for
kvshare's tests; abstract bodies are empty, as upstream's."""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterable, List, Optional


class LoadStoreSpec(ABC):
    @staticmethod
    @abstractmethod
    def medium() -> str:
        pass


@dataclass
class PrepareStoreOutput:
    block_hashes_to_store: List[bytes]
    store_spec: LoadStoreSpec
    block_hashes_evicted: List[bytes]


@dataclass
class OffloadingEvent:
    block_hashes: List[bytes]
    block_size: int
    medium: str
    removed: bool


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, block_hashes: Iterable[bytes]) -> Optional[int]:
        pass

    @abstractmethod
    def prepare_load(self, block_hashes: Iterable[bytes]) -> LoadStoreSpec:
        pass

    def touch(self, block_hashes: Iterable[bytes]):
        return

    def complete_load(self, block_hashes: Iterable[bytes]):
        return

    @abstractmethod
    def prepare_store(self, block_hashes: Iterable[bytes]) -> Optional[PrepareStoreOutput]:
        pass

    def complete_store(self, block_hashes: Iterable[bytes], success: bool = True):
        return

    def take_events(self) -> Iterable[OffloadingEvent]:
        return ()
