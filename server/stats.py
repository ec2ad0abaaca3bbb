"""Per-model counters behind the ModelStatistics RPC, counted as Triton counts them.

`inference_count` counts samples (rows), `execution_count` batches, so their ratio is the
mean batch size. Stage durations are per request: every request of a batch is charged
the batch's compute time, as in Triton. Updated from the event loop only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .v2pb import grpc_service_pb2 as pb


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, n: int = 1) -> None:
        self.count += n
        self.ns += int(seconds * 1e9 * n)

    def fill(self, msg: pb.StatisticDuration) -> None:
        msg.count = self.count
        msg.ns = self.ns


@dataclass(slots=True)
class BatchSizeStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStats:
    name: str
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    by_batch_size: dict[int, BatchSizeStats] = field(default_factory=dict)
    flushes: dict[str, int] = field(default_factory=dict)

    def record_batch(
        self,
        samples: int,
        requests: int,
        queue_s: float,
        input_s: float,
        infer_s: float,
        output_s: float,
        by_size: bool = True,
    ) -> None:
        """One executed batch; queue_s is the sum of its requests' queue waits. `by_size` False: not in
        `by_batch_size` (a failed batch rerun in parts, whose time is its parts')."""
        self.inference_count += samples
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        self.queue.count += requests
        self.queue.ns += int(queue_s * 1e9)
        self.compute_input.add(input_s, requests)
        self.compute_infer.add(infer_s, requests)
        self.compute_output.add(output_s, requests)
        if not by_size:
            return
        b = self.by_batch_size.get(samples)
        if b is None:
            b = self.by_batch_size[samples] = BatchSizeStats()
        b.compute_input.add(input_s)
        b.compute_infer.add(infer_s)
        b.compute_output.add(output_s)

    def record_flush(self, reason: str) -> None:
        self.flushes[reason] = self.flushes.get(reason, 0) + 1

    def to_proto(self) -> pb.ModelStatistics:
        m = pb.ModelStatistics(
            name=self.name,
            version="1",
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
        )
        s = m.inference_stats
        self.success.fill(s.success)
        self.fail.fill(s.fail)
        self.queue.fill(s.queue)
        self.compute_input.fill(s.compute_input)
        self.compute_infer.fill(s.compute_infer)
        self.compute_output.fill(s.compute_output)
        for size in sorted(self.by_batch_size):
            b = self.by_batch_size[size]
            e = m.batch_stats.add(batch_size=size)
            b.compute_input.fill(e.compute_input)
            b.compute_infer.fill(e.compute_infer)
            b.compute_output.fill(e.compute_output)
        return m
