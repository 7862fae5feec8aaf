# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/worker/worker.py of the
releases: TransferSpec and TransferResult as tuples, OffloadingHandler's
abstract methods. Written for kvshare's tests."""
from abc import ABC, abstractmethod
from typing import List, Tuple

from vllm.v1.kv_offload.abstract import LoadStoreSpec

TransferSpec = Tuple[LoadStoreSpec, LoadStoreSpec]
TransferType = Tuple[str, str]
TransferResult = Tuple[int, bool]


class OffloadingHandler(ABC):
    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        pass

    @abstractmethod
    def get_finished(self) -> List[TransferResult]:
        pass
