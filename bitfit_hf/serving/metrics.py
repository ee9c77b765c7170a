"""Prometheus metrics of one server (a registry of its own, so several servers in one process do not mix).

Under ``serve --workers N`` each worker process writes its values to files in ``$PROMETHEUS_MULTIPROC_DIR``
(prometheus_client's multiprocess mode) and ``render`` sums them over the live workers: counters and
histograms over every worker that ran, queue gauges over those alive, the others the largest of those alive.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """``bitfit_serve_*``: requests by adapter and status, latency, batch sizes, adapters per batch, queue
    depth per adapter, adapter switches."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        disable_created_metrics()  # no *_created series (as text-embeddings-inference and most exporters)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("bitfit_serve_requests", "Requests answered, by adapter and HTTP status",
                                ["adapter", "status"], registry=r)
        self.inputs = Counter("bitfit_serve_inputs", "Inputs predicted, by adapter", ["adapter"], registry=r)
        self.latency = Histogram("bitfit_serve_request_duration_seconds", "Time from arrival to answer of /predict",
                                 ["adapter"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("bitfit_serve_queue_duration_seconds", "Time a request waited for its batch",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("bitfit_serve_batch_size", "Inputs per forward pass, by batching mode",
                                    ["mode"], buckets=SIZE_BUCKETS, registry=r)
        self.batch_adapters = Histogram("bitfit_serve_batch_adapters", "Distinct adapters in one forward pass",
                                        buckets=SIZE_BUCKETS, registry=r)
        self.forward_time = Histogram("bitfit_serve_forward_duration_seconds", "Time of one forward pass",
                                      ["mode"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("bitfit_serve_queue_depth", "Requests waiting, by adapter", ["adapter"], registry=r,
                                 multiprocess_mode="livesum")
        self.queue_total = Gauge("bitfit_serve_queue_size", "Requests waiting, all adapters", registry=r,
                                 multiprocess_mode="livesum")
        self.switches = Counter("bitfit_serve_adapter_switches", "Adapter activations of switched adapters", registry=r)
        self.adapters = Gauge("bitfit_serve_adapters", "Adapters served, by batching mode", ["mode"], registry=r,
                              multiprocess_mode="livemax")
        self.pass_overhead = Gauge("bitfit_serve_pass_overhead_tokens", "What a forward pass costs beyond its tokens, "
                                   "in tokens, as learned from the passes so far (splitting a batch by length pays "
                                   "above it)", registry=r, multiprocess_mode="livemax")
        self.cancelled = Counter("bitfit_serve_cancelled", "Requests dropped before their forward pass, by reason",
                                 ["reason"], registry=r)

    def forget_adapter(self, name: str) -> None:
        try:
            self.queue_depth.remove(name)
        except KeyError:
            pass

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # serve --workers: every worker's values, summed
            summed = CollectorRegistry()
            multiprocess.MultiProcessCollector(summed)
            return generate_latest(summed)
        return generate_latest(self.registry)
