# SPDX-License-Identifier: Apache-2.0
"""Test mirror of the storage part of SGLang's metrics collector
(python/sglang/srt/observability/metrics_collector.py; before that
srt/metrics/collector.py): the StorageMetrics dataclass and the check that
StorageMetricsCollector.log_storage_metrics makes on what a backend's
get_stats() returns (None, or a StorageMetrics: anything else is an
AssertionError). Prometheus histograms are replaced by lists. Written for
kvshare's tests."""
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class StorageMetricsCollector:
    def __init__(self, labels=None):
        self.labels = labels or {}
        self.observed = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                         "backup_bandwidth": []}

    def log_storage_metrics(self, storage_metrics: Optional[StorageMetrics] = None):
        if storage_metrics is None:
            return
        assert isinstance(storage_metrics, StorageMetrics)
        for name, values in self.observed.items():
            values.extend(getattr(storage_metrics, name))
