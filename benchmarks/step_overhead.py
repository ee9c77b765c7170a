"""What the Trainer adds to a BitFit step: the same step as a plain PyTorch loop, through ``transformers.Trainer``
(BitFit's trainable set, nothing else of this project) and through ``BitFitTrainer``.

    python benchmarks/step_overhead.py                  # tiny BERT on the CPU: the host's cost is the whole cost
    python benchmarks/step_overhead.py --device cuda --model bert-base --batch-size 32 --seq 128 --precision bf16

On a tiny model (2 layers, hidden 64, batch 4, 8 tokens) the arithmetic is negligible, so a step's time is the
Python and dispatch work around it: what runs on the host of every step on any device. ``--model base-layout``
keeps BERT-base's 12 layers (its module tree and tensor count, which the per-step walks over the model scale
with) at hidden size 32. Every row trains the same
tensors (every bias plus the classifier) with AdamW (foreach on the CPU, fused on a GPU), gradient clipping at
1.0 and a linear schedule, on the same synthetic batches.

Timing: a row's time per step is the wall time from the end of warm-up step ``--warmup`` to the end of the last
step, divided by the steps in between, with the device synchronised only at those two points. Syncing every step
would hide exactly what is measured here, a host that waits for the device. Rows run ``--reps`` times in rotating
order in this one process (torch threads: ``--threads``); the table gives each row's median and its median ratio
to the plain loop over the reps, which cancels most of the machine's load drift.

Rows:

* ``plain``: the loop a user would write (forward, backward, clip, step, schedule, ``zero_grad``);
* ``trainer``: ``transformers.Trainer`` over the same trainable set (``requires_grad`` set by hand);
* ``bitfit``: ``BitFitTrainer`` (``bias_terms="all"``), as the recipes build it;
* ``bitfit-stock``: the same with ``Trainer``'s own step put back (its per-step non-finite check, FLOP count and
  clipping over every parameter): BitFitTrainer before its step changes (bitfit_hf/training/async_step.py);
* ``bitfit-fast``: ``BitFitTrainer`` under the recipes' fast path (``torch_compile`` in
  ``reduce-overhead`` mode; on a CPU Inductor without CUDA graphs). Off unless ``--rows`` names it: compiling
  takes tens of seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List

from cost_models import SyntheticDataset  # the synthetic batches of every training benchmark
from report import footer, load_average, machine_info, write_outputs  # benchmarks/report.py

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROWS = {
    "plain": "plain PyTorch loop",
    "trainer": "`transformers.Trainer`, BitFit's trainable set",
    "bitfit": "`BitFitTrainer`",
    "bitfit-stock": "`BitFitTrainer` with `Trainer`'s own step",
    "bitfit-fast": "`BitFitTrainer`, fast path (`torch_compile`, reduce-overhead)",
}
DEFAULT_ROWS = "plain,trainer,bitfit-stock,bitfit"


def build_model(name: str):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    if name == "tiny":
        config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                            vocab_size=1000, num_labels=2)
    elif name == "base-layout":  # BERT-base's 12 layers, 231 modules and 201 tensors, with next to no arithmetic
        config = BertConfig(hidden_size=32, num_hidden_layers=12, num_attention_heads=2, intermediate_size=64,
                            vocab_size=1000, num_labels=2)
    elif name == "bert-base":
        config = BertConfig(num_labels=2)
    else:
        raise SystemExit(f"--model {name!r}: choose tiny, base-layout or bert-base")
    return BertForSequenceClassification(config)


class Window:
    """Wall time between the end of step ``start`` and the end of step ``stop``, synchronised there only."""

    def __init__(self, device: str, start: int, stop: int):
        self.device, self.start, self.stop = device, start, stop
        self.begun = self.seconds = None

    def step_done(self, step: int) -> None:
        if step not in (self.start, self.stop):
            return
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        now = time.perf_counter()
        if step == self.start:
            self.begun = now
        else:
            self.seconds = (now - self.begun) / (self.stop - self.start)


def _bitfit_trainable(model) -> None:
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith("bias") or name.startswith("classifier"))


def run_plain(args, window: Window) -> None:
    import torch

    model = build_model(args.model).to(args.device)
    _bitfit_trainable(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    cuda = args.device.startswith("cuda")
    optimizer = torch.optim.AdamW(params, lr=1e-3, **({"fused": True} if cuda else {"foreach": True}))
    total = args.warmup + args.steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
    data = SyntheticDataset(args.batch_size * (total + 1), args.seq, model.config.vocab_size)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         pin_memory=cuda)
    autocast = torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.precision == "bf16")
    for step, batch in enumerate(loader, start=1):
        batch = {k: v.to(args.device, non_blocking=cuda) for k, v in batch.items()}
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        window.step_done(step)
        if step == total:
            break


def run_trainer(args, window: Window, kind: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from bitfit_hf import BitFitConfig, BitFitTrainer

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            window.step_done(state.global_step)

    model = build_model(args.model)
    total = args.warmup + args.steps
    options = dict(output_dir=tempfile.mkdtemp(prefix="step_overhead_"), per_device_train_batch_size=args.batch_size,
                   max_steps=total, learning_rate=1e-3, lr_scheduler_type="linear", report_to=[], save_strategy="no",
                   logging_strategy="no", eval_strategy="no", disable_tqdm=True, dataloader_drop_last=True,
                   use_cpu=args.device == "cpu", bf16=args.precision == "bf16", seed=0)
    if kind == "bitfit-fast":
        options.update(torch_compile=True, torch_compile_mode="reduce-overhead")
    training_args = TrainingArguments(**options)
    data = SyntheticDataset(args.batch_size * (total + 1), args.seq, model.config.vocab_size)
    if kind == "trainer":
        _bitfit_trainable(model)
        trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[Clock()])
    else:
        cls = BitFitTrainer
        if kind == "bitfit-stock":
            cls = type("StockStepBitFitTrainer", (BitFitTrainer,), {
                "training_step": Trainer.training_step, "floating_point_ops": Trainer.floating_point_ops,
                "_clip_grad_norm": Trainer._clip_grad_norm})
        trainer = cls(model=model, args=training_args, train_dataset=data, callbacks=[Clock()],
                      method_config=BitFitConfig(bias_terms="all"))
        if kind == "bitfit-stock":
            trainer._nonfinite_on_device = False  # the loop's own check, a host read per step
    trainer.train()


def measure(args, row: str) -> float:
    window = Window(args.device, args.warmup, args.warmup + args.steps)
    runner: Callable = run_plain if row == "plain" else (lambda a, w: run_trainer(a, w, row))
    runner(args, window)
    if window.seconds is None:
        raise SystemExit(f"row {row}: the window was never closed (fewer steps ran than {args.warmup + args.steps})")
    return window.seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "base-layout", "bert-base"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first (default 20)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma list of {', '.join(ROWS)} (default {DEFAULT_ROWS})")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or "plain" not in rows:
        raise SystemExit(f"--rows: unknown {unknown}; choose from {list(ROWS)} (plain is needed: the ratios use it)")

    import torch

    torch.set_num_threads(args.threads)
    info = machine_info()
    info["command"] = "python benchmarks/step_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info["load_before"] = load_average()
    times: Dict[str, List[float]] = {row: [] for row in rows}
    ratios: Dict[str, List[float]] = {row: [] for row in rows}
    for rep in range(args.reps):
        order = rows[rep % len(rows):] + rows[:rep % len(rows)]
        seconds = {row: measure(args, row) for row in order}
        for row in rows:
            times[row].append(seconds[row])
            ratios[row].append(seconds[row] / seconds["plain"])
        print(f"rep {rep + 1}: " + ", ".join(f"{row} {seconds[row] * 1e3:.2f} ms" for row in rows), flush=True)
    info["load_after"] = load_average()

    result = {row: {"ms_per_step": statistics.median(times[row]) * 1e3, "vs_plain": statistics.median(ratios[row]),
                    "reps_ms": [t * 1e3 for t in times[row]]} for row in rows}
    plain_ms = result["plain"]["ms_per_step"]
    lines = [f"**{args.model}** on {args.device} ({args.precision}), batch {args.batch_size}, sequence {args.seq}, "
             f"{args.threads} torch thread(s): median of {args.reps} runs of {args.steps} timed steps", "",
             "| row | ms per step | × plain loop | added per step |", "| --- | ---: | ---: | ---: |"]
    for row in rows:
        r = result[row]
        added = "-" if row == "plain" else f"{r['ms_per_step'] - plain_ms:+.2f} ms"
        lines.append(f"| {ROWS[row]} | {r['ms_per_step']:.2f} | {r['vs_plain']:.2f}× | {added} |")
    text = "\n".join(lines) + "\n\n" + footer(info)
    print(text, flush=True)
    write_outputs(args.json, args.markdown, {"machine": info, "args": vars(args), "rows": result}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
