"""Where BitFit + LoRA's step differs from LoRA alone and from BitFit: the operators of one training step of
each, side by side.

    python benchmarks/lora_profile.py                                  # all-MiniLM-L6-v2, batch 32, sequence 128
    python benchmarks/lora_profile.py --model bert-base --batch-size 2 --seq 16 --precision bf16
        # a step small enough that dispatching operators, not arithmetic, is its cost (as on a GPU in eager mode)

Each configuration runs in a fresh process, built as ``benchmarks/train_cost.py`` builds its rows (same names,
``benchmarks/cost_methods.py``): ``bitfit`` (the recipes' ``--method bitfit``, bias terms ``all``), the reference
``lora`` (PEFT LoRA r=8 on query/value through ``peft.get_peft_model``, ``bias="none"``) and ``bitfit_lora`` (BitFit
``all`` + LoRA r=8, the same LoRA settings); ``full`` trains the stock model. A step is what the Trainer runs: forward, backward,
gradient clipping, AdamW (foreach, as BitFitTrainer on a CPU), ``zero_grad``; with ``--precision bf16`` the
forward runs under bf16 autocast, and ``--frozen-bf16`` stores frozen weights in bf16 (``frozen_dtype``).

Per configuration: the median thread CPU time of ``--reps`` steps; the operators ``torch.profiler`` records
over ``--profile-steps`` steps (self CPU time and calls per step, with input shapes for the products, so a
weight gradient -- a ``[in, tokens] x [tokens, out]`` product -- would show); and how many ATen operators a
step dispatches in forward, backward and optimizer (a ``TorchDispatchMode`` count: on a GPU each is about
one kernel launch). The table lists the operators whose calls or time differ between configurations.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

from cost_methods import canonical, label, names_help, parse_row, prepare_model, warn_aliases
from report import footer, load_average, machine_info, write_outputs  # benchmarks/report.py

METHODS = ("bitfit", "lora", "bitfit_lora")  # the default comparison; --methods may add full or any other row
PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm")


def build(model_name: str, method: str, frozen_bf16: bool):
    import torch
    from cost_models import build_model

    row = parse_row(method)
    model = prepare_model(build_model(model_name), row)
    if frozen_bf16 and row.method != "full":
        from bitfit_hf.training.frozen_dtype import cast_frozen_weights

        cast_frozen_weights(model, torch.bfloat16)
    return model.train()


def measure(model_name: str, method: str, batch: int, seq: int, reps: int, profile_steps: int, precision: str,
            frozen_bf16: bool) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    model = build(model_name, method, frozen_bf16)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(min(1000, vocab // 2), vocab, (batch, seq), generator=g),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long),
              "labels": torch.randint(0, 2, (batch,), generator=g)}
    phase = {"name": "forward"}

    def step():
        phase["name"] = "forward"
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**inputs).loss
        phase["name"] = "backward"
        loss.backward()
        phase["name"] = "optimizer"
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[(phase["name"], func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    for _ in range(2):
        step()
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        step()
        times.append(time.thread_time() - t0)
    with Count() as counter:
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(profile_steps):
            step()
    ops = collections.defaultdict(lambda: {"self_s": 0.0, "calls": 0})
    shapes = collections.Counter()
    for event in prof.key_averages(group_by_input_shape=True):
        ops[event.key]["self_s"] += event.self_cpu_time_total / 1e6 / profile_steps
        ops[event.key]["calls"] += event.count / profile_steps
        if event.key in PRODUCTS:
            shapes[f"{event.key} {event.input_shapes[:3]}"] += event.count / profile_steps
    dispatched = collections.Counter()
    for (name, _), count in counter.counts.items():
        dispatched[name] += count
    return {"method": method, "threads": torch.get_num_threads(), "step_cpu_s": statistics.median(times),
            "step_cpu_s_all": times, "trainable_params": sum(p.numel() for p in params), "trainable_tensors": len(params),
            "ops": dict(ops), "product_shapes": dict(shapes), "dispatched": dict(dispatched),
            "dispatched_by_op": {f"{p}:{n}": c for (p, n), c in counter.counts.items()}}


def differing_ops(rows: dict, min_seconds: float, limit: int):
    """Operators whose calls differ, or whose self time differs by more than ``min_seconds``, largest first."""
    names = set().union(*[set(r["ops"]) for r in rows.values()])

    def get(r, name, key):
        return r["ops"].get(name, {}).get(key, 0)

    picked = []
    for name in names:
        calls = [round(get(r, name, "calls"), 1) for r in rows.values()]
        secs = [get(r, name, "self_s") for r in rows.values()]
        if len(set(calls)) > 1 or max(secs) - min(secs) > min_seconds:
            picked.append((max(secs), name))
    return [name for _, name in sorted(picked, reverse=True)[:limit]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", choices=["minilm", "bert-base", "tiny"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5, help="timed steps per configuration (after 2 warm-up steps)")
    parser.add_argument("--profile-steps", type=int, default=2, help="steps recorded by torch.profiler")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--frozen-bf16", action="store_true", help="frozen weights stored in bf16 (needs --precision bf16)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"default: {','.join(METHODS)}. A {names_help()} "
                        "(no @ options: --frozen-bf16 is for every row)")
    parser.add_argument("--top-ops", type=int, default=16)
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.frozen_bf16 and args.precision != "bf16":
        parser.error("--frozen-bf16 needs --precision bf16 (a bf16 weight beside a float32 bias runs under autocast)")

    if args.worker:
        print("RESULT " + json.dumps(measure(args.model, args.worker, args.batch_size, args.seq, args.reps,
                                             args.profile_steps, args.precision, args.frozen_bf16)))
        return 0

    info = machine_info()
    info["command"] = "python benchmarks/lora_profile.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info["load_before"] = load_average()
    named = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        rows_asked = [parse_row(m) for m in named]
    except ValueError as err:
        parser.error(str(err))
    if any(row.options or row.plain for row in rows_asked):
        parser.error("--methods: rows without @ options or plain- (every row here is one profiled step)")
    warn_aliases(named)
    methods = list(dict.fromkeys(canonical(m) for m in named))
    common = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--batch-size", str(args.batch_size),
              "--seq", str(args.seq), "--reps", str(args.reps), "--profile-steps", str(args.profile_steps),
              "--precision", args.precision, *(["--frozen-bf16"] if args.frozen_bf16 else [])]
    rows = {}
    for method in methods:
        proc = subprocess.run([*common, "--worker", method], capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"worker {method} failed:\n{proc.stderr[-3000:]}")
        rows[method] = json.loads(lines[-1][len("RESULT "):])
    info["load_after"] = load_average()

    how = f"{args.precision}" + (", frozen weights bf16" if args.frozen_bf16 else "")
    heads = " | ".join(label(m, trainer=False) for m in methods)
    lines = [f"**{args.model}**, batch {args.batch_size}, sequence {args.seq}, {how}, "
             f"{rows[methods[0]]['threads']} thread(s): one training step (forward, backward, clipping, AdamW)", "",
             f"| | {heads} |", "| --- |" + " ---: |" * len(methods)]
    lines.append("| trainable parameters (tensors) | " + " | ".join(
        f"{rows[m]['trainable_params']:,} ({rows[m]['trainable_tensors']})" for m in methods) + " |")
    lines.append("| step, thread CPU time (median) | " + " | ".join(f"{rows[m]['step_cpu_s']:.3f} s" for m in methods) + " |")
    for part in ("forward", "backward", "optimizer"):
        lines.append(f"| ATen operators dispatched, {part} | " + " | ".join(
            f"{rows[m]['dispatched'].get(part, 0):,}" for m in methods) + " |")
    lines.append("| ATen operators dispatched, step | " + " | ".join(
        f"{sum(rows[m]['dispatched'].values()):,}" for m in methods) + " |")
    lines += ["", f"Operators whose calls or self CPU time differ (per step, over {args.profile_steps} profiled steps):", "",
              f"| operator | {heads} |", "| --- |" + " ---: |" * len(methods)]
    for name in differing_ops(rows, 0.01 * min(r["step_cpu_s"] for r in rows.values()), args.top_ops):
        cells = []
        for m in methods:
            op = rows[m]["ops"].get(name)
            cells.append("-" if op is None else f"{op['self_s']:.3f} s, {op['calls']:g} calls")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    keys = sorted(set().union(*[set(rows[m]["product_shapes"]) for m in methods]))
    changed = [k for k in keys if len({round(rows[m]["product_shapes"].get(k, 0), 1) for m in methods}) > 1]
    if changed:
        lines += ["", "Matrix products whose count differs (operator, input shapes: calls per step):", "",
                  f"| product | {heads} |", "| --- |" + " ---: |" * len(methods)]
        lines += [f"| `{k}` | " + " | ".join(f"{rows[m]['product_shapes'].get(k, 0):g}" for m in methods) + " |"
                  for k in changed]
    text = "\n".join(lines) + "\n\n" + footer(info)
    print(text, flush=True)
    write_outputs(args.json, args.markdown, {"machine": info, "args": vars(args), "rows": rows}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
