# SPDX-License-Identifier: Apache-2.0
"""Test mirror of vLLM's vllm/v1/kv_offload/worker/worker.py of the
base-era releases: TransferSpec as a (src, dst) tuple, TransferResult as a
dataclass, OffloadingHandler's abstract methods. Written for kvshare's
tests."""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import List, Optional, Tuple

from vllm.v1.kv_offload.base import LoadStoreSpec

TransferSpec = Tuple[LoadStoreSpec, LoadStoreSpec]
TransferType = Tuple[str, str]


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: Optional[int] = None
    transfer_time: Optional[float] = None
    transfer_type: Optional[TransferType] = None


class OffloadingHandler(ABC):
    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        pass

    @abstractmethod
    def get_finished(self) -> List[TransferResult]:
        pass

    @abstractmethod
    def wait(self, job_ids) -> None:
        pass
