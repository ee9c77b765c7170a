"""The one worker thread that owns the models, and the bounded queue in front of it.

Request handlers tokenize, then :meth:`Worker.submit` a :class:`Job`; the worker takes jobs in arrival
order until the batch holds ``max_batch_size`` inputs or ``max_batch_tokens`` padded tokens (rows times
the longest row: what a padded forward pass holds), or the first job has waited ``max_wait_ms``, then:

* jobs for mixed adapters of one architecture go through the model together (one
  :class:`~bitfit_hf.adapters.multitask.MultiTaskModel` forward per chunk of inputs within both caps, longest
  first, cut where the padding saved outweighs another pass, whatever the number of adapters among them);
* jobs for switched adapters are grouped by adapter (the active one first, then by arrival), so the bank
  switches at most once per adapter per batch.

Adding or removing an adapter is a control job in the same queue: it runs between two batches, on this
thread, so no forward pass ever sees a half-changed model. Jobs whose client left or whose time ran out
are dropped before their forward pass.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import torch

from bitfit_hf.adapters.task_types import QUESTION_ANS
from bitfit_hf.inference.batches import collate, per_row
from bitfit_hf.inference.inputs import Feature
from bitfit_hf.serving.metrics import Metrics
from bitfit_hf.serving.models import Registry
from bitfit_hf.serving.pass_cost import PassCost
from bitfit_hf.serving.tasks import InputError
from bitfit_hf.utils.os_threads import name_os_thread

logger = logging.getLogger(__name__)

#: The OS name of the worker thread and of the torch threads it starts (``top -H``; benchmarks/serve_load.py).
WORKER_THREAD = "bitfit-worker"


class QueueFull(Exception):
    pass


class Draining(Exception):
    pass


@dataclass(eq=False)
class Job:
    """One request's inputs for one adapter (or, with ``control``, an admin change)."""

    adapter: str
    inputs: List[Feature]
    on_done: Callable[[Any, Optional[BaseException]], None]
    deadline: float = float("inf")
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    control: Optional[Callable[[], Any]] = None
    finished: bool = False

    def finish(self, result: Any = None, error: Optional[BaseException] = None) -> None:
        if self.finished:
            return
        self.finished = True
        try:
            self.on_done(result, error)
        except Exception:  # noqa: BLE001 - a callback must never stop the worker
            logger.exception("bitfit-hf serve: a request's completion callback failed")


class Worker:
    """The worker thread and its queue. ``submit`` is thread-safe; everything else runs on the thread."""

    def __init__(self, registry: Registry, metrics: Metrics, *, max_batch_size: int, max_wait_ms: float,
                 max_queue: int, pad_id: int, left_padding: bool = False, threads: Optional[int] = None,
                 max_batch_tokens: Optional[int] = None):
        self.registry = registry
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens or float("inf")
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.pad_id = pad_id
        self.left_padding = left_padding
        self.threads = threads
        self._queue: Deque[Job] = deque()
        self._waiting = 0  # prediction jobs in the queue (control jobs do not count against max_queue)
        self._cond = threading.Condition()
        self._stop = False
        self._paused = False
        self.draining = False
        self.batches = 0
        self.pass_cost = PassCost()  # what a forward pass costs beyond its tokens, learned from this worker's passes
        metrics.pass_overhead.set(self.pass_cost.overhead_tokens)
        self._thread = threading.Thread(target=self._run, name="bitfit-serve-worker", daemon=True)

    # ---- any thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def queued(self) -> int:
        return self._waiting

    def submit(self, job: Job) -> None:
        with self._cond:
            if self.draining:
                raise Draining()
            if job.control is None:
                if self._waiting >= self.max_queue:
                    raise QueueFull()
                self._waiting += 1
                self.metrics.queue_depth.labels(job.adapter).inc()
                self.metrics.queue_total.inc()
            self._queue.append(job)
            self._cond.notify()

    def pause(self, paused: bool = True) -> None:
        """Hold the queue (jobs wait and time out; nothing runs). For tests and maintenance."""
        with self._cond:
            self._paused = paused
            self._cond.notify()

    def stop(self, timeout: Optional[float] = None) -> bool:
        """Refuse new jobs, finish every queued one, end the thread. True when it ended within ``timeout``."""
        with self._cond:
            self.draining = True
            self._paused = False
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def run_batch(self, jobs: List[Job]) -> None:
        """Run prediction jobs now, on the caller's thread, as the worker runs one batch (mixed groups in one
        forward pass each, switched adapters grouped). For embedding the batcher in another serving stack's
        batch handler (a LitServe ``predict``, a Ray Serve ``@serve.batch`` method): only when :meth:`start`
        was never called, so one thread owns the models."""
        if self._thread.is_alive():
            raise RuntimeError("run_batch() is for a worker that was not started: the worker thread owns the models.")
        with torch.inference_mode():
            self._predict(jobs)

    # ---- the worker thread --------------------------------------------------------------------
    def _take(self, job: Job) -> None:
        self._queue.popleft()
        if job.control is None:
            self._waiting -= 1
            self.metrics.queue_depth.labels(job.adapter).dec()
            self.metrics.queue_total.dec()

    def _next_batch(self) -> Optional[List[Job]]:
        with self._cond:
            while not self._queue or self._paused:
                if self._stop and not self._queue:
                    return None
                self._cond.wait()
            head = self._queue[0]
            if head.control is not None:
                self._take(head)
                return [head]
            batch: List[Job] = []
            size = longest = 0
            deadline = head.arrived + self.max_wait
            while True:
                while self._queue and self._queue[0].control is None:
                    job = self._queue[0]
                    grown = (size + len(job.inputs), max([longest, *(f.length for f in job.inputs)]))
                    if batch and not self._fits(*grown):
                        return batch
                    self._take(job)
                    batch.append(job)
                    size, longest = grown
                full = size >= self.max_batch_size or size * longest >= self.max_batch_tokens
                if full or (self._queue and self._queue[0].control is not None) or self._stop:
                    return batch
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return batch
                self._cond.wait(remaining)

    def _fits(self, rows: int, longest: int) -> bool:
        """Whether ``rows`` inputs padded to ``longest`` tokens stay within both caps of a batch."""
        return rows <= self.max_batch_size and rows * longest <= self.max_batch_tokens

    def _chunks(self, rows: List[Tuple[int, int, Feature]], packed: bool = False) -> List[List[Tuple[int, int, Feature]]]:
        """``rows`` (longest first) cut into forward passes within both caps, where the cut computes the fewest
        tokens: each pass costs its rows times its longest row (padding included; ``packed``: the rows' own
        tokens, as a packed pass computes) plus what a pass costs beyond its tokens (:attr:`pass_cost`, learned
        from this worker's passes), so inputs of very different lengths go in padded passes of their own when the
        padding saved is worth a pass. A row past the token cap alone is a pass of its own."""
        lengths = [row[2].length for row in rows]
        overhead = self.pass_cost.overhead_tokens
        n = len(rows)
        before = [0]
        for length in lengths:
            before.append(before[-1] + length)
        best = [0.0] + [float("inf")] * n  # best[k]: the cheapest cut of the first k rows
        cut = [0] * (n + 1)
        for end in range(1, n + 1):
            for start in range(end - 1, -1, -1):  # rows[start:end] padded to rows[start]'s length
                if end - start > 1 and not self._fits(end - start, lengths[start]):
                    break
                tokens = before[end] - before[start] if packed else (end - start) * lengths[start]
                cost = best[start] + tokens + overhead
                if cost < best[end]:
                    best[end], cut[end] = cost, start
        chunks: List[List[Tuple[int, int, Feature]]] = []
        end = n
        while end > 0:
            chunks.append(rows[cut[end]:end])
            end = cut[end]
        return chunks[::-1]

    def _run(self) -> None:
        name_os_thread(WORKER_THREAD)  # before torch starts its threads here: they take the name too
        if self.threads:
            torch.set_num_threads(self.threads)
        self._build_tables()
        with torch.inference_mode():
            while True:
                jobs = self._next_batch()
                if jobs is None:
                    return
                try:
                    if jobs[0].control is not None:
                        self._control(jobs[0])
                    else:
                        self._predict(jobs)
                except BaseException as err:  # noqa: BLE001 - the worker outlives any one batch
                    logger.error("bitfit-hf serve: a batch failed: %s", traceback.format_exc())
                    for job in jobs:
                        job.finish(None, err)

    def _control(self, job: Job) -> None:
        try:
            # Tensors an adapter brings (tables, inserted modules) must be ordinary tensors: the model keeps
            # them, and inference tensors made here would break later in-place and version-counter use.
            with torch.inference_mode(False), torch.no_grad():
                result = job.control()
            self._build_tables()
            job.finish(result, None)
        except BaseException as err:  # noqa: BLE001 - reported to the admin request
            job.finish(None, err)

    def _build_tables(self) -> None:
        """The routing tables of every group, built here on the worker, the thread that reads them: tables built
        on the event loop's thread made every forward pass slower under load (docs/serving.md)."""
        with torch.inference_mode(False), torch.no_grad():
            self.registry.build_tables()

    def _predict(self, jobs: List[Job]) -> None:
        now = time.monotonic()
        entries = self.registry.entries
        mixed: Dict[Tuple, List[Job]] = {}
        switched: Dict[str, List[Job]] = {}
        for job in jobs:
            self.metrics.queue_time.observe(now - job.arrived)
            if job.cancelled:
                self.metrics.cancelled.labels("client_gone").inc()
                job.finish(None, InputError(499, "the client closed the connection", "cancelled"))
                continue
            if now > job.deadline:
                self.metrics.cancelled.labels("timeout").inc()
                job.finish(None, InputError(504, "the request timed out in the queue", "timeout"))
                continue
            entry = entries.get(job.adapter)
            if entry is None:
                job.finish(None, InputError(404, f"adapter {job.adapter!r} was removed while the request waited; "
                                                 f"served: {', '.join(sorted(entries)) or 'none'}.", "not_found"))
                continue
            if entry.mode == "mixed":
                mixed.setdefault(entry.group, []).append(job)
            else:
                switched.setdefault(job.adapter, []).append(job)
        self.batches += 1
        for key, group_jobs in mixed.items():
            self._run_group(key, group_jobs, mixed=True)
        order = sorted(switched, key=lambda name: (not self._is_active(name), switched[name][0].arrived))
        for name in order:
            self._run_group(entries[name].group, switched[name], mixed=False)

    def _is_active(self, name: str) -> bool:
        entry = self.registry.entries.get(name)
        group = self.registry.groups.get(entry.group) if entry else None
        return getattr(group, "active", None) == name

    def _run_group(self, key, jobs: List[Job], mixed: bool) -> None:
        """Every input of ``jobs`` through ``key``'s group in chunks within ``max_batch_size`` and
        ``max_batch_tokens`` (longest first, so a chunk pads little); each job gets its outputs in its own order."""
        group = self.registry.groups[key]
        model = group.model
        device = next(model.parameters()).device
        rows = [(j, i, enc) for j, job in enumerate(jobs) for i, enc in enumerate(job.inputs)]
        rows.sort(key=lambda row: -row[2].length)
        results: List[List[Any]] = [[None] * len(job.inputs) for job in jobs]
        failed: Dict[int, BaseException] = {}
        mode = "mixed" if mixed else "switch"
        packed = bool(getattr(group, "packs", False))
        for chunk in self._chunks(rows, packed):
            tasks = [jobs[j].adapter for j, _, _ in chunk]
            try:
                batch = collate([enc for _, _, enc in chunk], self.pad_id, self.left_padding, device)
                began = time.perf_counter()
                switched = False
                if mixed:
                    out = group.forward(batch, tasks)
                    logits, raw = out.logits, out.outputs
                else:
                    switches = getattr(group, "switches", 0)
                    raw = group.forward(batch, tasks[0])
                    switched = group.switches != switches
                    if switched:
                        self.metrics.switches.inc()
                    logits = raw.get("logits") if hasattr(raw, "get") else raw[0]
                seconds = time.perf_counter() - began
                self.metrics.forward_time.labels(mode).observe(seconds)
                if not switched:  # a switch's own cost is not a pass's
                    lengths = [enc.length for _, _, enc in chunk]
                    self.pass_cost.observe(sum(lengths) if packed else len(chunk) * max(lengths), seconds)
                    self.metrics.pass_overhead.set(self.pass_cost.overhead_tokens)
                self.metrics.batch_size.labels(mode).observe(len(chunk))
                self.metrics.batch_adapters.observe(len(set(tasks)))
                if logits is None and getattr(raw, "start_logits", None) is None:
                    raise RuntimeError("the model returned neither logits nor start / end logits")
                outputs = per_row(logits, raw, [enc.length for _, _, enc in chunk], self.left_padding,
                                  [_width(self.registry, name) for name in tasks])
            except BaseException as err:  # noqa: BLE001 - these jobs fail, the others go on
                logger.error("bitfit-hf serve: a forward pass failed: %s", traceback.format_exc())
                for j, _, _ in chunk:
                    failed[j] = err
                continue
            for (j, i, _), value in zip(chunk, outputs):
                results[j][i] = value
        for j, job in enumerate(jobs):
            if j in failed:
                job.finish(None, failed[j])
            else:
                self.metrics.inputs.labels(job.adapter).inc(len(job.inputs))
                job.finish(results[j], None)


def _width(registry: Registry, name: str) -> Optional[int]:
    entry = registry.entries.get(name)
    if entry is None or entry.task == QUESTION_ANS:
        return None
    return entry.config.num_labels or (len(entry.id2label) or None)

