"""Where a training step's time goes: forward and backward of full fine-tuning against BitFit, without
the Trainer or an optimizer, with dropout on and off, and the operators that dominate a BitFit step.

    python benchmarks/step_breakdown.py                      # all-MiniLM-L6-v2, batch 32, sequence 128
    python benchmarks/step_breakdown.py --model bert-base --batch-size 8
    python benchmarks/step_breakdown.py --compile            # both models through torch.compile (Inductor)

This is the diagnostic behind "Why MiniLM stays below 1.40x" in benchmarks/README.md: BitFit can only
save the weight-gradient products (and the embedding gradient); everything else in the step is the same.
Each configuration runs in a fresh process; times are medians over ``--reps`` steps after 2 warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from report import footer, load_average, machine_info, write_outputs  # benchmarks/report.py


def measure(model_name: str, method: str, dropout: bool, batch: int, seq: int, reps: int, top_ops: int,
            compiled: bool = False) -> dict:
    """Forward and backward seconds of one configuration (run in a worker process). ``compiled``: the
    model runs through ``torch.compile`` (its first two steps, where compilation happens, are warm-up)."""
    import torch
    from cost_methods import parse_row, prepare_model
    from cost_models import build_model

    model = build_model(model_name)
    if not dropout:  # BERT's attention passes its nn.Dropout's p to the attention kernel too
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    model = prepare_model(model, parse_row(method))  # full: the stock model; bitfit: the recipes' --method bitfit
    model.train()
    generator = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(min(1000, model.config.vocab_size // 2), model.config.vocab_size, (batch, seq), generator=generator),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long),
              "labels": torch.randint(0, 2, (batch,), generator=generator)}
    run = torch.compile(model) if compiled else model
    forward, backward = [], []
    for step in range(2 + reps):
        t0 = time.perf_counter()
        loss = run(**inputs).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if step >= 2:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    result = {"forward_s": statistics.median(forward), "backward_s": statistics.median(backward),
              "attention_heads": model.config.num_attention_heads}
    if top_ops and not compiled:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(**inputs).loss.backward()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        result["top_ops"] = [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total,
                              "calls": e.count} for e in events[:top_ops]]
    return result


def dropout_mask_seconds(shape, threads: int, reps: int = 5) -> float:
    """Median seconds of drawing one CPU dropout mask (``bernoulli_``, as ``nn.Dropout`` does) of ``shape``
    with ``threads`` torch threads: equal times at 1 and 2 threads mean the draw runs on one core."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mask = torch.empty(shape)
        mask.bernoulli_(0.9)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            mask.bernoulli_(0.9)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", choices=["minilm", "bert-base", "tiny"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--top-ops", type=int, default=8, help="operators listed for the BitFit step (0: none)")
    parser.add_argument("--compile", action="store_true", help="run both methods through torch.compile")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        method, dropout = args.worker.split(":")
        top = args.top_ops if method == "bitfit" and dropout == "on" else 0
        print("RESULT " + json.dumps(measure(args.model, method, dropout == "on", args.batch_size, args.seq,
                                             args.reps, top, args.compile)))
        return 0

    info = machine_info()
    info["command"] = "python benchmarks/step_breakdown.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info["load_before"] = load_average()
    rows = {}
    common = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--batch-size", str(args.batch_size),
              "--seq", str(args.seq), "--reps", str(args.reps), "--top-ops", str(args.top_ops),
              *(["--compile"] if args.compile else [])]
    for dropout in ("on", "off"):
        for method in ("full", "bitfit"):
            proc = subprocess.run([*common, "--worker", f"{method}:{dropout}"], capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"worker {method}:{dropout} failed:\n{proc.stderr[-3000:]}")
            rows[(method, dropout)] = json.loads(lines[-1][len("RESULT "):])
    import torch

    # the attention-probability mask is the largest one per layer
    mask_shape = (args.batch_size, rows[("full", "on")]["attention_heads"], args.seq, args.seq)
    masks = {threads: dropout_mask_seconds(mask_shape, threads) for threads in sorted({1, torch.get_num_threads()})}
    info["load_after"] = load_average()

    how = ", through `torch.compile`" if args.compile else ""
    lines = [f"**{args.model}**, batch {args.batch_size}, sequence {args.seq}: one forward and one backward{how}, "
             f"no Trainer, no optimizer (median of {args.reps})", "",
             "| | forward | backward | forward + backward | BitFit faster by |", "| --- | ---: | ---: | ---: | ---: |"]
    for dropout in ("on", "off"):
        full = rows[("full", dropout)]
        for method in ("full", "bitfit"):
            row = rows[(method, dropout)]
            both = row["forward_s"] + row["backward_s"]
            ratio = (full["forward_s"] + full["backward_s"]) / both
            name = ("full fine-tuning" if method == "full" else "BitFit `all`") + ("" if dropout == "on" else ", dropout off")
            lines.append(f"| {name} | {row['forward_s']:.2f} s | {row['backward_s']:.2f} s | {both:.2f} s | "
                         f"{'-' if method == 'full' else f'{ratio:.2f}x'} |")
    ops = rows[("bitfit", "on")].get("top_ops")
    if ops:
        lines += ["", "Operators of one BitFit step (forward + backward), by self CPU time:", "",
                  "| operator | self time | share | calls |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| `{o['op']}` | {o['self_s']:.3f} s | {o['share']:.0%} | {o['calls']} |" for o in ops]
    lines += ["", f"One attention-dropout mask ({' x '.join(map(str, mask_shape))} = {math.prod(mask_shape):,} values, "
              "`bernoulli_`): " + ", ".join(f"{s * 1e3:.1f} ms with {t} thread{'s' * (t > 1)}" for t, s in masks.items())]
    text = "\n".join(lines) + "\n\n" + footer(info)
    print(text, flush=True)
    write_outputs(args.json, args.markdown, {"machine": info, "compiled": args.compile,
                                             "rows": {f"{m}:{d}": r for (m, d), r in rows.items()},
                                             "dropout_mask": {"shape": mask_shape, "seconds_by_threads": masks}}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
