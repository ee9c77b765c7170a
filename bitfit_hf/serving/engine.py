"""Everything a server holds, framework aside: the tokenizer, the adapters and their models, the worker.

``Engine.create(specs, ...)`` loads the base once and every adapter onto it, refusing (one line each)
adapters for another base or of a method that cannot share it; ``predict`` and ``add`` / ``remove`` are
what the HTTP routes call. The engine holds no state a replica must share with another: two servers
started from the same adapter list answer alike.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.adapters.task_types import SEQ_CLS
from bitfit_hf.inference.answers import answer
from bitfit_hf.inference.inputs import InputRefused, check_items, encode, length_limit, parse_inputs
from bitfit_hf.inference.predictor import pad_id_of
from bitfit_hf.serving.batcher import Draining, Job, QueueFull, Worker
from bitfit_hf.serving.config import ADMIN_TOKEN_ENV, AdapterSpec, ServeConfig, ServeError, check_name, require_specs
from bitfit_hf.serving.metrics import Metrics
from bitfit_hf.serving.models import TASKS, Backbone, Entry, Registry
from bitfit_hf.serving.tasks import InputError, refused
from bitfit_hf.utils.constants import __version__
from bitfit_hf.utils.errors import UserError, first_line
from bitfit_hf.utils.os_threads import name_os_thread
from bitfit_hf.utils.secrets import SecretStr

logger = logging.getLogger(__name__)


def load_adapter_source(source: str, revision: Optional[str] = None) -> BitFitAdapter:
    """An adapter from a local folder or a Hub id (at ``revision``); one-line :class:`ServeError` otherwise."""
    try:
        return BitFitAdapter.from_pretrained(source, **({"revision": revision} if revision else {}))
    except UserError as err:
        raise ServeError(first_line(err)) from None
    except (OSError, ValueError) as err:
        raise ServeError(f"cannot load {source!r}: {first_line(err)}") from None


def load_tokenizer(folders: List[str], base: Optional[str]):
    """The tokenizer beside the first adapter that has one, else the base's."""
    from transformers import AutoTokenizer

    from bitfit_hf.data.assets import packaged_copy_or

    for source in [*folders, *([packaged_copy_or(base)] if base else [])]:
        try:
            return AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError, TypeError):
            continue
    raise ServeError(f"no tokenizer beside the adapters or at the base {base!r}; pass --tokenizer DIR.")


#: The OS name of the tokenizing threads (``top -H``; benchmarks/serve_load.py).
TOKENIZER_THREAD = "bitfit-tokenize"


class Tokenizers:
    """Tokenizing off the event loop: a few worker threads, each with its own copy of the tokenizer per
    truncation side. A fast tokenizer keeps truncation settings in its Rust state, set by each call, so
    threads sharing one race; and a request's side is a copy's setting, so the shared tokenizer never changes."""

    def __init__(self, tokenizer, workers: int):
        self.tokenizer = tokenizer
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=TOKENIZER_THREAD,
                                        initializer=name_os_thread, initargs=(TOKENIZER_THREAD,))
        self._local = threading.local()

    def for_side(self, side: str):
        """This thread's copy of the tokenizer cutting on ``side`` ("right" or "left")."""
        copies = self._local.__dict__.setdefault("copies", {})
        if side not in copies:
            copies[side] = copy.deepcopy(self.tokenizer)
            copies[side].truncation_side = side
        return copies[side]

    async def run(self, fn, *args):
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except RuntimeError:  # the pool was shut down
            raise InputError(503, "the server is shutting down.", "unavailable") from None
        return await future

    def close(self) -> None:
        """Takes no new work; what was handed in still runs (its requests then meet the draining queue)."""
        self._pool.shutdown(wait=False)


def tokenizing_workers() -> int:
    """Two threads at least (one slow request does not hold the rest), four at most (the model's forward
    pass needs the cores more)."""
    return max(2, min(4, os.cpu_count() or 1))


class Engine:
    """The served adapters, the worker that runs them, the limits and the metrics."""

    def __init__(self, registry: Registry, tokenizer, config: ServeConfig, admin_token: Optional[str] = None):
        self.registry = registry
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = Metrics()
        self.admin_token = SecretStr(admin_token) if admin_token else None
        self.started = time.time()
        self.max_input_length = length_limit(config.max_input_length, tokenizer, _model_config(registry)).tokens
        self.tokenizers = Tokenizers(tokenizer, tokenizing_workers())
        self.worker = Worker(registry, self.metrics, max_batch_size=config.max_batch_size,
                             max_batch_tokens=config.max_batch_tokens, max_wait_ms=config.max_wait_ms,
                             max_queue=config.max_queue, pad_id=pad_id_of(tokenizer),
                             left_padding=getattr(tokenizer, "padding_side", "right") == "left", threads=config.threads)
        self._count_adapters()

    # ---- building -----------------------------------------------------------------------------
    @classmethod
    def create(cls, specs: List[AdapterSpec], config: Optional[ServeConfig] = None, base_model: Optional[str] = None,
               tokenizer: Any = None, admin_token: Optional[str] = None, start: bool = True) -> "Engine":
        """Load every adapter; a :class:`ServeError` listing one line per refused adapter if any is refused."""
        config = config or ServeConfig()
        require_specs(specs)
        refused: List[str] = []
        loaded: List[Tuple[str, str, Optional[str], BitFitAdapter]] = []
        folders: List[str] = []
        for spec in specs:
            try:
                adapter = load_adapter_source(spec.source, spec.revision)
            except ServeError as err:
                refused.append(f"adapter {spec.name!r} ({spec.describe()}): {err}")
                continue
            loaded.append((spec.name, spec.source, spec.revision, adapter))
            folder = adapter.config.metadata.get("resolved_directory") or os.path.expanduser(spec.source)
            if os.path.isdir(folder):
                folders.append(folder)
        if refused:
            raise ServeError("\n".join(refused))
        registry = Registry(Backbone(base_model, config.device, config.dtype), config.batching, config.packing)
        order = {spec.name: i for i, spec in enumerate(specs)}
        for name, reason in sorted(registry.add_many(loaded), key=lambda pair: order[pair[0]]):  # as given
            spec = specs[order[name]]
            refused.append(f"adapter {name!r} ({spec.describe()}): {reason}")
        if refused:
            raise ServeError("\n".join(refused))
        if tokenizer is None or isinstance(tokenizer, str):
            tokenizer = load_tokenizer([tokenizer] if tokenizer else folders,
                                       None if tokenizer else registry.backbone.source)
        engine = cls(registry, tokenizer, config, admin_token=admin_token)
        if start:
            engine.worker.start()
        return engine

    @staticmethod
    def admin_token_from_env() -> Optional[str]:
        return os.environ.get(ADMIN_TOKEN_ENV) or None

    def _count_adapters(self) -> None:
        for mode in ("mixed", "switch"):
            self.metrics.adapters.labels(mode).set(sum(e.mode == mode for e in self.registry.entries.values()))

    # ---- reading ------------------------------------------------------------------------------
    @property
    def entries(self) -> Dict[str, Entry]:
        return dict(self.registry.entries)

    def adapters(self) -> List[Dict[str, Any]]:
        """Each served adapter's description, with ``packed``: whether its passes run packed (``--packing``; None
        until the worker's probe has run for its group)."""
        base = self.registry.backbone.source
        groups = self.registry.groups
        return [{**e.describe(base), "packed": getattr(groups.get(e.group), "packs", False)}
                for e in self.registry.entries.values()]

    def info(self) -> Dict[str, Any]:
        c = self.config
        return {
            **self.registry.backbone.describe(),
            "version": __version__, "router": "bitfit-hf serve",
            "adapters": len(self.registry.entries),
            "max_batch_size": c.max_batch_size, "max_batch_tokens": c.max_batch_tokens, "max_wait_ms": c.max_wait_ms,
            "max_queue": c.max_queue,
            "max_concurrent_requests": c.max_queue, "max_client_batch_size": c.max_client_batch_size,
            "max_input_length": self.max_input_length, "doc_stride": c.doc_stride, "payload_limit": c.payload_limit,
            "request_timeout_s": c.request_timeout_s, "auto_truncate": c.auto_truncate, "batching": c.batching,
            "packing": c.packing,
            "admin": self.admin_token is not None,
        }

    def healthy(self) -> bool:
        return self.worker.alive and not self.worker.draining

    def check_token(self, header: Optional[str]) -> Optional[InputError]:
        """``None`` when ``Authorization: Bearer <token>`` matches the admin token."""
        if self.admin_token is None:
            return InputError(403, f"the admin routes are off: start the server with {ADMIN_TOKEN_ENV} set.", "forbidden")
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), str(self.admin_token).encode()):
            return InputError(401, "missing or wrong admin token (Authorization: Bearer <token>).", "unauthorized")
        return None

    # ---- predicting ---------------------------------------------------------------------------
    def resolve(self, name: Optional[str]) -> Entry:
        entries = self.registry.entries
        if name is None:
            if len(entries) == 1:
                return next(iter(entries.values()))
            raise InputError(422, f"say which adapter: \"adapter\" is one of {', '.join(sorted(entries))}.")
        if not isinstance(name, str) or name not in entries:
            raise InputError(404, f"no adapter {name!r}; served: {', '.join(sorted(entries)) or 'none'}.", "not_found",
                             adapters=sorted(entries))
        return entries[name]

    def resolve_many(self, value: Any) -> Tuple[List[Entry], bool]:
        """The adapters a request names: one name (or none, when one adapter is served), a list of names, or
        ``{"task": "classification"}`` (every adapter of that task); ``several`` when the answer is keyed by adapter."""
        entries = self.registry.entries
        if value is None or isinstance(value, str):
            return [self.resolve(value)], False
        if isinstance(value, dict):
            task = value.get("task")
            if set(value) != {"task"} or task not in TASKS.values():
                raise InputError(422, "\"adapter\": {\"task\": T} takes one of " + ", ".join(map(repr, TASKS.values())) + ".")
            chosen = [entries[name] for name in sorted(entries) if TASKS[entries[name].task] == task]
            if not chosen:
                raise InputError(404, f"no {task} adapter is served; served: {', '.join(sorted(entries)) or 'none'}.",
                                 "not_found", adapters=sorted(entries))
            return chosen, True
        if not isinstance(value, list) or not value or len(set(map(str, value))) != len(value):
            raise InputError(422, "\"adapter\" is a name, a list of distinct names, or {\"task\": T}.")
        chosen = [self.resolve(name) for name in value]
        if len({e.task for e in chosen}) > 1:
            raise InputError(422, "the adapters of one request answer one task (their inputs are read one way): "
                                  + ", ".join(f"{e.name} ({TASKS[e.task]})" for e in chosen) + ".")
        return chosen, True

    async def prepare_off_loop(self, body: Any) -> Tuple[List[Entry], Any, list, Dict[str, Any], bool]:
        """:meth:`prepare_request` on a tokenizing thread, so a long input does not stall every other request."""
        return await self.tokenizers.run(self.prepare_request, body)

    def prepare(self, body: Any) -> Tuple[Entry, Any, list, Dict[str, Any]]:
        """Validate a ``/predict`` body naming one adapter and tokenize it: ``(entry, parsed, encoded, options)``."""
        entries, parsed, encoded, options, several = self.prepare_request(body)
        if several:
            raise InputError(422, "this call takes one adapter.")
        return entries[0], parsed, encoded, options

    def prepare_request(self, body: Any) -> Tuple[List[Entry], Any, list, Dict[str, Any], bool]:
        """Validate a ``/predict`` body and tokenize its inputs once for every adapter it names:
        ``(entries, parsed, encoded, options, several)``."""
        if not isinstance(body, dict):
            raise InputError(422, "the body must be a JSON object {\"inputs\": ..., \"adapter\": \"<name>\"}.")
        fields = ("inputs", "adapter", "truncate", "truncation_direction", "raw_scores", "top_k", "max_answer_len",
                  "handle_impossible_answer")
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise InputError(422, f"unknown field(s) {', '.join(unknown)}; /predict takes {', '.join(fields)}.")
        entries, several = self.resolve_many(body.get("adapter"))
        try:
            entry, parsed, encoded, options = self._prepare_for(entries[0], body)
            for other in entries[1:]:
                check_other(other, parsed)
            total = len(parsed.items) * len(entries)
            if total > self.config.max_client_batch_size:
                raise InputError(413, f"{len(parsed.items)} input(s) for {len(entries)} adapters is {total} answers; this "
                                      f"server takes at most {self.config.max_client_batch_size} per request "
                                      "(max_client_batch_size). Split the request.", "payload_too_large")
        except InputError as err:
            err.adapter = entries[0].name if not several else None  # /metrics counts it under the adapter asked for
            raise
        return entries, parsed, encoded, options, several

    def _prepare_for(self, entry: Entry, body: Dict[str, Any]) -> Tuple[Entry, Any, list, Dict[str, Any]]:
        truncate = body.get("truncate", self.config.auto_truncate)
        raw_scores = body.get("raw_scores", False)
        impossible = body.get("handle_impossible_answer", False)
        direction = body.get("truncation_direction", "Right")
        if not all(isinstance(v, bool) for v in (truncate, raw_scores, impossible)):
            raise InputError(422, "'truncate', 'raw_scores' and 'handle_impossible_answer' are true or false.")
        for key in ("top_k", "max_answer_len"):
            value = body.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InputError(422, f"'{key}' is a positive integer.")
        if direction not in ("Right", "Left"):
            raise InputError(422, "'truncation_direction' is \"Right\" or \"Left\".")
        if entry.task != SEQ_CLS and not getattr(self.tokenizer, "is_fast", False):
            raise InputError(422, f"adapter {entry.name!r} tags words or answers questions, which needs the word and "
                                  "character offsets of a fast tokenizer; start the server with --tokenizer pointing "
                                  "at one (a tokenizer.json).")
        try:
            parsed = parse_inputs(entry.task, body.get("inputs"))
            if len(parsed.items) > self.config.max_client_batch_size:
                raise InputError(413, f"{len(parsed.items)} inputs in one request; this server takes at most "
                                      f"{self.config.max_client_batch_size} (max_client_batch_size). Split the batch.",
                                 "payload_too_large")
            check_items(entry.config, parsed.items)
            encoded = encode(self.tokenizers.for_side(direction.lower()), entry.task, parsed.items,
                             self.max_input_length, truncate, self.config.doc_stride)
        except InputRefused as err:
            raise refused(err) from None
        options = {"raw_scores": raw_scores, "top_k": body.get("top_k"), "max_answer_len": body.get("max_answer_len"),
                   "handle_impossible_answer": impossible}
        return entry, parsed, encoded, options

    def answer(self, entry: Entry, parsed, encoded, outputs: List[Any], options: Dict[str, Any]) -> Any:
        """Every input's answer from its features' outputs (several windows per QA input)."""
        answers = answer(entry.task, outputs, encoded, len(parsed.items), entry.id2label, entry.config.problem_type,
                         options)
        return answers[0] if parsed.single else answers

    def submit(self, entry: Entry, encoded: list, on_done, deadline: float) -> Job:
        job = Job(adapter=entry.name, inputs=encoded, on_done=on_done, deadline=deadline)
        try:
            self.worker.submit(job)
        except QueueFull:
            raise InputError(503, f"the queue is full ({self.config.max_queue} requests waiting); retry in "
                                  f"{self.config.retry_after_s} s.", "overloaded",
                             headers={"Retry-After": str(self.config.retry_after_s)}) from None
        except Draining:
            raise InputError(503, "the server is shutting down.", "unavailable") from None
        return job

    # ---- changing (runs on the worker, between batches) -----------------------------------------
    async def add(self, name: str, source: str, revision: Optional[str] = None) -> Dict[str, Any]:
        try:
            check_name(name)
        except ServeError as err:
            raise InputError(422, str(err)) from None
        if name in self.registry.entries:
            raise InputError(409, f"an adapter named {name!r} is already served; DELETE it first or pick another name.",
                             "conflict")
        try:
            adapter = await asyncio.to_thread(load_adapter_source, source, revision)  # file / Hub I/O off the loop
        except ServeError as err:
            raise InputError(422, f"adapter {name!r} ({source}) not added: {err}", "load_failed") from None
        try:  # a new head type's model, built here so that inference goes on meanwhile
            await asyncio.to_thread(self.registry.prebuild, adapter)
        except (UserError, ValueError, OSError):
            pass  # the add on the worker meets the same cause and refuses with it

        def change():
            entry = self.registry.add(name, source, revision, adapter)
            self._count_adapters()
            return entry.describe(self.registry.backbone.source)

        try:
            return await self._on_worker(change)
        except (UserError, ValueError) as err:
            raise InputError(422, f"adapter {name!r} ({source}) not added: {first_line(err)}", "load_failed") from None

    async def remove(self, name: str) -> None:
        if name not in self.registry.entries:
            raise InputError(404, f"no adapter {name!r}; served: {', '.join(sorted(self.registry.entries)) or 'none'}.",
                             "not_found")

        def change():
            self.registry.remove(name)
            self.metrics.forget_adapter(name)
            self._count_adapters()

        try:
            await self._on_worker(change)
        except KeyError:
            raise InputError(404, f"no adapter {name!r}.", "not_found") from None

    async def _on_worker(self, fn):
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(result, error):
            loop.call_soon_threadsafe(settle_future, future, result, error)

        try:
            self.worker.submit(Job(adapter="", inputs=[], on_done=done, control=fn))
        except Draining:
            raise InputError(503, "the server is shutting down.", "unavailable") from None
        return await future

    def close(self, timeout: Optional[float] = None) -> bool:
        self.tokenizers.close()
        return self.worker.stop(timeout)


def check_other(entry: Entry, parsed) -> None:
    """Inputs parsed for one adapter of a request checked against another's (a pair task and a single one)."""
    try:
        check_items(entry.config, parsed.items)
    except InputRefused as err:
        raise refused(err) from None


def settle_future(future: "asyncio.Future", result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _model_config(registry: Registry):
    """The config of the served base (any group's model: they share the base)."""
    for group in registry.groups.values():
        return getattr(group.model, "config", None)
    return None


__all__ = ["Engine", "TASKS", "load_adapter_source", "load_tokenizer"]
