"""Training and serving speed on one GPU in one call: the table of docs/speed.md and
``benchmarks/results/gpu-summary.json``.

    python benchmarks/gpu_summary.py --prepare gpu_assets       # here: tokenizer, real sentences, serving wheels
    pip install --no-index --find-links gpu_assets/wheels fastapi uvicorn prometheus-client pyyaml   # there, if missing
    python benchmarks/gpu_summary.py --assets gpu_assets        # there: about 6 minutes on one H200

Everything runs on a BERT-base-shaped model (``BertConfig()``, random weights: speed does not depend on them),
batch 32, bf16 autocast with float32 trained tensors, fused AdamW, each row in a process of its own:

* training rows through ``BitFitTrainer`` / ``Trainer`` as a user calls them, eager and on the fast path
  (``torch_compile`` in ``reduce-overhead`` mode, fixed-length batches of 128 tokens, last batch dropped);
  ``bitfit-fast-stock`` is the fast path with BitFitTrainer's own step changes turned off (``Trainer``'s step: the
  non-finite check and blocking copies), to show what they are worth;
* ``ceiling``: the same BitFit step as a plain PyTorch loop under ``torch.compile(mode="reduce-overhead")``;
* ``real-text``: BitFit on the fast path over the real movie-review sentences (variable length), batches padded
  by the recipes' own collator to length buckets (``recipes/glue.py`` itself when ``datasets`` is installed);
* serving: ``benchmarks/serve_load.py`` with the server on the GPU in bf16, 1 and 64 adapters mixed.

A row's speed is the wall time from the end of step ``--warmup`` (compilation and CUDA-graph recording happen in
the first steps) to the end of step ``--warmup + --steps``, the device synchronised at those two points only. Rows
that name ``syncs`` count the host's waits on the device per step (``torch.cuda.set_sync_debug_mode``) over a few
more steps. Results are written as each row ends (``--out``), so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cost_methods import method_config, parse_row, peft_reference  # noqa: E402 - train_cost.py's rows
from cost_models import SyntheticDataset  # noqa: E402 - the synthetic batches of every training benchmark

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BATCH, SEQ = 32, 128
#: --smoke: a tiny model on the CPU, compiled by aot_eager (no code generation): checks every row runs, in seconds.
SMOKE = {"on": False}
TRAIN_ROWS = ["bitfit", "bitfit-fast", "bitfit-fast-stock", "full", "full-fast", "lora", "lora-fast", "bitfit-lora",
              "bitfit-lora-fast", "ceiling", "real-text"]
SYNC_ROWS = {"bitfit", "bitfit-fast", "bitfit-fast-stock"}
PROFILE_ROWS = {"bitfit", "bitfit-fast"}  # where the time goes, if a target is missed: torch.profiler over a few steps
PROFILE_STEPS = 4
SERVE_WHEELS = ["fastapi", "starlette", "uvicorn", "h11", "anyio", "sniffio", "click", "prometheus-client", "pydantic",
                "pydantic-core", "annotated-types", "typing-inspection", "pyyaml", "annotated-doc"]
SUMMARY_KEYS = {
    "bitfit_samples_s": ("bitfit", "samples_s"), "bitfit_fast_samples_s": ("bitfit-fast", "samples_s"),
    "full_samples_s": ("full", "samples_s"), "full_fast_samples_s": ("full-fast", "samples_s"),
    "lora_samples_s": ("lora", "samples_s"), "bitfit_lora_samples_s": ("bitfit-lora", "samples_s"),
    "lora_fast_samples_s": ("lora-fast", "samples_s"), "bitfit_lora_fast_samples_s": ("bitfit-lora-fast", "samples_s"),
    "ceiling_bitfit_samples_s": ("ceiling", "samples_s"), "bitfit_fast_tflops": ("bitfit-fast", "tflops"),
    "real_text_samples_s": ("real-text", "samples_s"),
}


# ------------------------------------------------------------------------------------------ the rows
def bert_base():
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    if SMOKE["on"]:
        return BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                        intermediate_size=64, num_labels=2))
    return BertForSequenceClassification(BertConfig(num_labels=2))


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device_options(fast: bool) -> dict:
    """TrainingArguments of the device: bf16 and fused AdamW on the GPU; under --smoke the CPU, aot_eager."""
    if SMOKE["on"]:
        return dict(use_cpu=True, optim="adamw_torch", **({"torch_compile": True, "torch_compile_backend": "aot_eager"}
                                                          if fast else {}))
    return dict(bf16=True, optim="adamw_torch_fused",
                **({"torch_compile": True, "torch_compile_mode": "reduce-overhead"} if fast else {}))


def train_flops(config, tokens: int, full: bool) -> float:
    """Model arithmetic of one step: a forward is 2·N·T over the non-embedding matrices plus attention's QKᵀ and PV
    (4·L·T·S·H); the backward doubles a forward for activation gradients and, in full fine-tuning only, once more
    for weight gradients."""
    n = 12 * config.num_hidden_layers * config.hidden_size ** 2
    forward = 2 * n * tokens + 4 * config.num_hidden_layers * tokens * SEQ * config.hidden_size
    return forward * (3 if full else 2)


class Window:
    """Seconds per step between the end of step ``start`` and of step ``stop`` (synchronised there only), then
    host waits per step over ``sync_steps`` more steps, then a ``torch.profiler`` summary of ``profile_steps``
    more, when asked."""

    def __init__(self, start: int, stop: int, sync_steps: int = 0, profile_steps: int = 0):
        self.start, self.stop, self.sync_steps, self.profile_steps = start, stop, sync_steps, profile_steps
        self.begun = self.seconds = None
        self.syncs: Optional[float] = None
        self.profile: Optional[dict] = None
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
            else:
                self.seconds = (now - self.begun) / (self.stop - self.start)
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


def trainer_row(row: str, args) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from bitfit_hf import BitFitTrainer

    fast = row.endswith("-fast") or row.endswith("-fast-stock")
    method = row.replace("-fast-stock", "").replace("-fast", "")
    window = Window(args.warmup, args.warmup + args.steps, 4 if row in SYNC_ROWS else 0,
                    PROFILE_STEPS if row in PROFILE_ROWS else 0)
    total = args.warmup + args.steps + window.extra_steps

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            window.step_done(state.global_step)

    options = dict(output_dir=tempfile.mkdtemp(prefix="gpu_summary_"), per_device_train_batch_size=BATCH, max_steps=total,
                   learning_rate=1e-4 if method == "full" else 1e-3, report_to=[], save_strategy="no",
                   logging_strategy="no", eval_strategy="no", disable_tqdm=True, dataloader_drop_last=True, seed=0,
                   **device_options(fast))
    training_args = TrainingArguments(**options)
    model = bert_base()
    data = SyntheticDataset(BATCH * (total + 2), SEQ, model.config.vocab_size)
    spec = parse_row(method)  # train_cost.py's rows: the references full / lora, else a recipes' --method
    if spec.reference:
        if spec.method != "full":
            model = peft_reference(model, spec.method)
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
                      method_config=method_config(spec.method, spec.flags))
        if row.endswith("-stock"):
            trainer._nonfinite_on_device = False
    began = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - began
    seconds = window.seconds
    config = bert_base().config if method != "lora" else model.config
    return {"samples_s": BATCH / seconds, "ms_per_step": seconds * 1e3, "syncs_per_step": window.syncs,
            "profile": window.profile,
            "tflops": train_flops(config, BATCH * SEQ, method == "full") / seconds / 1e12, "wall_s": wall,
            "first_steps_s": window.begun - began, "peak_gib": peak_gib()}  # train() to the end of warm-up


def peak_gib() -> Optional[float]:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def ceiling_row(args) -> dict:
    """The plain loop: the issue's ceiling (BitFit, CUDA graphs), same batch and settings."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = bert_base().to(device).train()
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith("bias") or name.startswith("classifier"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, fused=device == "cuda")
    step_fn = (torch.compile(model, backend="aot_eager") if SMOKE["on"] else torch.compile(model, mode="reduce-overhead"))
    ids = torch.randint(1000, model.config.vocab_size, (BATCH, SEQ), device=device)
    labels = torch.randint(0, 2, (BATCH,), device=device)
    window = Window(args.warmup, args.warmup + args.steps)
    began = time.perf_counter()
    for step in range(1, args.warmup + args.steps + 1):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = step_fn(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.step_done(step)
    return {"samples_s": BATCH / window.seconds, "ms_per_step": window.seconds * 1e3,
            "tflops": train_flops(model.config, BATCH * SEQ, False) / window.seconds / 1e12,
            "wall_s": time.perf_counter() - began}


def real_text_row(args) -> dict:
    """BitFit on the fast path over the real sentences, batches padded by the recipes' collator to length buckets."""
    from transformers import AutoTokenizer, DataCollatorWithPadding, TrainerCallback, TrainingArguments

    from bitfit_hf import BitFitTrainer
    from bitfit_hf.data.readers import read_movie_reviews
    from bitfit_hf.recipe_kit.arg_groups import recipe_training_class
    from bitfit_hf.recipe_kit.fast_path import apply_fast_path

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.assets, "tokenizer"))
    rows = read_movie_reviews(os.path.join(args.assets, "movieReviewSnippets_GroundTruth.txt"))
    encoded = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=SEQ)
    features = [{"input_ids": ids, "attention_mask": mask, "label": r["label"]}
                for ids, mask, r in zip(encoded["input_ids"], encoded["attention_mask"], rows)]
    window = Window(args.warmup, args.warmup + args.steps)
    total = args.warmup + args.steps
    counts = {"real": 0, "padded": 0, "batches": 0}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            window.step_done(state.global_step)

    training_args = recipe_training_class(TrainingArguments)(
        output_dir=tempfile.mkdtemp(prefix="gpu_summary_"), per_device_train_batch_size=BATCH, max_steps=total,
        learning_rate=1e-3, report_to=[], save_strategy="no", logging_strategy="no", eval_strategy="no",
        disable_tqdm=True, seed=0, fast_path="on", **device_options(False))
    if SMOKE["on"]:
        training_args.torch_compile_backend = "aot_eager"
    collate = apply_fast_path(training_args, DataCollatorWithPadding(tokenizer), SEQ, len(features))

    def counting(batch_features):
        batch = collate(batch_features)
        if counts["batches"] >= args.warmup:
            counts["real"] += int(batch["attention_mask"].sum())
            counts["padded"] += batch["attention_mask"].numel()
        counts["batches"] += 1
        return batch

    trainer = BitFitTrainer(model=bert_base(), args=training_args, train_dataset=features, data_collator=counting,
                            callbacks=[Clock()], method_config=method_config("bitfit"))
    trainer.train()
    return {"samples_s": BATCH / window.seconds, "ms_per_step": window.seconds * 1e3,
            "padded_tokens_s": counts["padded"] / max(1, counts["batches"] - args.warmup) / window.seconds,
            "real_token_share": counts["real"] / max(1, counts["padded"]), "buckets": list(collate.buckets),
            "how": "BitFitTrainer + the recipes' apply_fast_path collator (datasets-free)",
            "peak_gib": peak_gib()}


def worker(row: str, args) -> dict:
    if row == "ceiling":
        return ceiling_row(args)
    if row == "real-text":
        return real_text_row(args)
    return trainer_row(row, args)


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


def run_row(row: str, args, timeout: float) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", row, "--assets", args.assets or "",
            "--steps", str(args.steps), "--warmup", str(args.warmup), *(["--smoke"] if SMOKE["on"] else [])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(lines[-1][len("RESULT "):])


def serve_rows(args, timeout: float) -> dict:
    """serve_load.py on the GPU (bf16): 1 and 64 adapters mixed, over a saved random BERT-base and the tokenizer."""
    import torch  # noqa: F401 - the base is built here once, on the CPU
    import transformers as T

    base = tempfile.mkdtemp(prefix="gpu_summary_base_")
    T.AutoTokenizer.from_pretrained(os.path.join(args.assets, "tokenizer")).save_pretrained(base)
    bert_base().bert.save_pretrained(base)
    out = os.path.join(base, "serve.json")
    where = (["--device", "cpu", "--dtype", "float32", "--requests", "40", "--warmup", "8"] if SMOKE["on"] else
             ["--device", "cuda", "--dtype", "bfloat16", "--requests", "1200"])
    argv = [sys.executable, os.path.join(HERE, "serve_load.py"), "--base", base, *where, "--adapters", "1,64",
            "--reps", "1", "--clients", "32", "--max-batch-size", "64", "--json", out]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0 or not os.path.isfile(out):
        return {"error": proc.stderr[-1500:]}
    with open(out) as handle:
        configs = {c["key"]: c for c in json.load(handle)["configs"]}
    return {key: {k: configs[key][k] for k in ("rps", "p50_ms", "p99_ms", "mean_batch", "mean_adapters_per_batch")}
            for key in configs}


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


def prepare(folder: str) -> None:
    """What the GPU machine lacks: the tokenizer files, the real sentences, the serving stack's wheels."""
    import shutil

    from bitfit_hf.data.assets import asset_path, minilm_path

    os.makedirs(os.path.join(folder, "tokenizer"), exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        source = os.path.join(minilm_path(), name)
        if os.path.isfile(source):
            shutil.copy(source, os.path.join(folder, "tokenizer", name))
    shutil.copy(asset_path("movie_reviews"), os.path.join(folder, "movieReviewSnippets_GroundTruth.txt"))
    wheels = os.path.join(folder, "wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--python-version",
                    "3.12", "-d", wheels, *SERVE_WHEELS], check=True)
    size = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)
    print(f"{folder}: {size / 2**20:.1f} MiB (carry it with the checkout)")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default="gpu_assets", help="the folder --prepare wrote (default gpu_assets)")
    parser.add_argument("--prepare", metavar="FOLDER", help="write what the GPU machine lacks into FOLDER and stop")
    parser.add_argument("--rows", default=",".join(TRAIN_ROWS), help="comma list of training rows (default: all)")
    parser.add_argument("--no-serve", action="store_true", help="leave out the serving rows")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per training row (default 100)")
    parser.add_argument("--warmup", type=int, default=12, help="untimed first steps (default 12)")
    parser.add_argument("--budget-s", type=float, default=450, help="stop starting rows after this (default 450)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "gpu-summary.json"))
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU: checks the rows run (no figures)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    SMOKE["on"] = args.smoke
    if args.prepare:
        prepare(args.prepare)
        return 0
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args)), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        raise SystemExit("gpu_summary.py measures a CUDA GPU and found none (python benchmarks/step_overhead.py "
                         "measures the host's share on a CPU).")
    started = time.monotonic()
    rows: Dict[str, dict] = {}
    serving: dict = {}
    record = {"command": "python benchmarks/gpu_summary.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "batch": BATCH, "seq": SEQ, "rows": rows, "serving": serving}

    def write() -> None:
        record["summary"] = summarise(rows, serving)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(record, handle, indent=1)
        os.replace(tmp, args.out)

    for row in [r.strip() for r in args.rows.split(",") if r.strip()]:
        left = args.budget_s - (time.monotonic() - started)
        if left < 20:
            rows[row] = {"error": "not run: the time budget was spent"}
            continue
        rows[row] = run_row(row, args, timeout=min(left, 240))
        print(f"{row}: {json.dumps(rows[row])[:300]}", flush=True)
        write()
    if not args.no_serve:
        left = args.budget_s + 120 - (time.monotonic() - started)
        serving.update(serve_rows(args, timeout=max(60, left)) if left > 60 else {"error": "not run: budget spent"})
        print(f"serving: {json.dumps(serving)[:400]}", flush=True)
    write()
    print(json.dumps(record["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
