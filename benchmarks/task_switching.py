"""Adapter size, task switching and mixed-task batched inference from one frozen backbone.

    python benchmarks/task_switching.py            # BERT-base config + all-MiniLM-L6-v2 (a few minutes)
    python benchmarks/task_switching.py --quick    # tiny random BERT, seconds (the test suite runs it)

Three measurements:

1. **Adapter size**: a BitFit adapter (``all`` and ``paper-subset`` biases + a 2-label head) against the full
   checkpoint, both as written to disk (safetensors), in float32 and float16
   (``BitFitAdapter.save_pretrained(dir, dtype="float16")``, ``model.half().save_pretrained``).
2. **Switching the active task** on a loaded backbone with ``AdapterBank.activate`` (8 adapters loaded),
   against loading an adapter from disk onto the backbone, and against reloading a full fine-tuned model
   (``from_pretrained`` of a saved checkpoint). Also checks that after ``activate`` the outputs equal those of
   a fresh model with the adapter applied.
3. **Mixed-task batched inference** with :class:`bitfit_hf.MultiTaskModel`: one forward pass over a batch
   whose examples belong to 8 different tasks, against the same batch on a single task (``bank.activate`` +
   the plain model), the wrapper on a single task, and the naive alternative (one forward per task group,
   activating each task in turn). Configurations are interleaved rep by rep (rotating order) so background
   load hits them alike; medians and the median of paired ratios are reported. Correctness: the largest
   absolute logit difference against running each task separately, and whether every argmax agrees.

All randomness is seeded; the adapters are BitFit adapters with randomly perturbed biases and heads (their
values do not change any timing).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional

from report import footer, load_average, machine_info, write_outputs  # benchmarks/report.py

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = {
    "bert-base": "random BERT-base config (12 layers, hidden 768, 109.5M params)",
    "minilm": "all-MiniLM-L6-v2 (pretrained; 6 layers, hidden 384, 22.7M params)",
    "tiny": "random tiny BERT (2 layers, hidden 64, vocab 1000)",
}


def _quiet() -> None:
    import logging
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    logging.getLogger("bitfit_hf").setLevel(logging.WARNING)


def build_base(name: str, num_labels: int = 2, seed: int = 0):
    import torch
    import transformers as T

    torch.manual_seed(seed)
    if name == "minilm":
        from bitfit_hf.data.assets import minilm_path

        return T.AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=num_labels).eval()
    if name == "bert-base":
        return T.BertForSequenceClassification(T.BertConfig(num_labels=num_labels)).eval()
    if name == "tiny":
        cfg = T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                           vocab_size=1000, num_labels=num_labels)
        return T.BertForSequenceClassification(cfg).eval()
    raise ValueError(f"unknown model {name!r}")


def make_adapter(base, num_labels: int, seed: int, bias_terms: str = "all"):
    """A BitFit adapter on ``base``'s frozen weights: biases and a ``num_labels`` head, randomly perturbed
    (as training would move them)."""
    import torch
    import transformers as T

    from bitfit_hf import BitFitAdapter, BitFitConfig, apply_bitfit

    config = copy.deepcopy(base.config)
    config.num_labels = num_labels
    config.id2label = {i: f"task{seed}_label{i}" for i in range(num_labels)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    with torch.device("meta"):
        model = T.AutoModelForSequenceClassification.from_config(config)
    model = model.to_empty(device="cpu")
    state = {k: v for k, v in base.state_dict().items() if not k.startswith("classifier.")}
    model.load_state_dict(state, strict=False)
    torch.manual_seed(seed)
    model.classifier.reset_parameters()
    apply_bitfit(model, BitFitConfig(bias_terms=bias_terms))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=g))
    adapter = BitFitAdapter.from_model(model)
    del model
    return adapter


def _dir_bytes(path: str, name: str) -> int:
    return os.path.getsize(os.path.join(path, name))


def _batch(n: int, seq: int, vocab: int, seed: int = 1):
    import torch

    g = torch.Generator().manual_seed(seed)
    low = 1000 if vocab > 2000 else 5
    ids = torch.randint(low, vocab, (n, seq), generator=g)
    mask = torch.ones(n, seq, dtype=torch.long)
    mask[1::4, seq // 2:] = 0  # some padded rows
    return ids, mask


# --------------------------------------------------------------------------------------------------
def measure_sizes(base, tmp: str) -> dict:
    import torch

    from bitfit_hf.utils.constants import WEIGHTS_NAME

    out = {}
    full_dir = os.path.join(tmp, "full32")
    base.save_pretrained(full_dir)
    out["full_fp32_bytes"] = _dir_bytes(full_dir, "model.safetensors")
    half = copy.deepcopy(base).to(torch.float16)
    half.save_pretrained(os.path.join(tmp, "full16"))
    out["full_fp16_bytes"] = _dir_bytes(os.path.join(tmp, "full16"), "model.safetensors")
    del half
    out["total_params"] = sum(p.numel() for p in base.parameters())
    for terms in ("all", "paper-subset"):
        adapter = make_adapter(base, 2, seed=1, bias_terms=terms)
        numel = sum(t.numel() for t in adapter.tensors.values())
        d32, d16 = os.path.join(tmp, f"ad32-{terms}"), os.path.join(tmp, f"ad16-{terms}")
        adapter.save_pretrained(d32)
        adapter.save_pretrained(d16, dtype="float16")
        out[terms] = {
            "params": numel,
            "bias_params": sum(t.numel() for n, t in adapter.tensors.items() if not n.startswith("classifier.")),
            "fp32_bytes": _dir_bytes(d32, WEIGHTS_NAME),
            "fp16_bytes": _dir_bytes(d16, WEIGHTS_NAME),
            "config_json_bytes": _dir_bytes(d32, "adapter_config.json"),
        }
    out["full_dir"] = full_dir
    out["adapter_dir"] = os.path.join(tmp, "ad32-all")
    return out


def measure_switching(base, adapters: Dict[str, object], full_dir: str, adapter_dir: str, reps: int,
                      reload_reps: int) -> dict:
    import torch
    import transformers as T

    from bitfit_hf import AdapterBank, BitFitAdapter

    bank = AdapterBank(copy.deepcopy(base))
    t0 = time.perf_counter()
    for name, adapter in adapters.items():
        bank.add(name, adapter)
    add_seconds = (time.perf_counter() - t0) / len(adapters)
    names = list(adapters)
    # correctness: after activate, the logits equal a fresh model with that adapter applied
    ids, mask = _batch(4, 16, base.config.vocab_size)
    worst = 0.0
    with torch.no_grad():
        for name in names[:3]:
            bank.activate(name)
            got = bank.model(input_ids=ids, attention_mask=mask).logits
            fresh = copy.deepcopy(base)
            if fresh.classifier.out_features != adapters[name].config.num_labels:
                fresh.classifier = torch.nn.Linear(fresh.config.hidden_size, adapters[name].config.num_labels)
                fresh.config.num_labels = adapters[name].config.num_labels
            adapters[name].apply_to(fresh)
            want = fresh.eval()(input_ids=ids, attention_mask=mask).logits
            worst = max(worst, float((got - want).abs().max()))
            del fresh
    # activate: many switches, cycling through the tasks
    times = []
    for i in range(reps):
        name = names[i % len(names)]
        t = time.perf_counter()
        bank.activate(name)
        times.append(time.perf_counter() - t)
    restore = []
    for _ in range(max(10, reps // 10)):
        t = time.perf_counter()
        bank.restore_base()
        restore.append(time.perf_counter() - t)
    # loading an adapter from disk onto a loaded backbone, and reloading a whole model
    load_adapter, reload_full = [], []
    model = copy.deepcopy(base)
    for _ in range(reload_reps):
        t = time.perf_counter()
        BitFitAdapter.from_pretrained(adapter_dir).apply_to(model)
        load_adapter.append(time.perf_counter() - t)
        t = time.perf_counter()
        T.AutoModelForSequenceClassification.from_pretrained(full_dir)
        reload_full.append(time.perf_counter() - t)
    n_tensors = len(bank._base)
    held = sum(t.numel() * t.element_size() for ts in bank._tensors.values() for t in ts.values())
    return {
        "adapters": len(adapters),
        "tensors_swapped_per_switch": n_tensors,
        "activate_median_s": statistics.median(times),
        "activate_p90_s": sorted(times)[int(0.9 * (len(times) - 1))],
        "activate_reps": reps,
        "restore_base_median_s": statistics.median(restore),
        "bank_add_s": add_seconds,
        "load_adapter_from_disk_s": statistics.median(load_adapter),
        "reload_full_model_s": statistics.median(reload_full),
        "bank_adapter_bytes": held,
        "activate_max_abs_diff": worst,
    }


def measure_mixed(base, adapters: Dict[str, object], batch: int, seq: int, reps: int, warmup: int) -> dict:
    import torch

    from bitfit_hf import AdapterBank, MultiTaskModel

    names = list(adapters)
    bank = AdapterBank(copy.deepcopy(base))
    for name, adapter in adapters.items():
        bank.add(name, adapter)
    mt = MultiTaskModel(bank)
    model = bank.model
    ids, mask = _batch(batch, seq, base.config.vocab_size, seed=7)
    tasks = [names[i % len(names)] for i in range(batch)]  # every task in the batch, interleaved
    task_ids = mt.task_index(tasks)
    single_ids = torch.zeros(batch, dtype=torch.long)
    groups = {n: torch.tensor([i for i, t in enumerate(tasks) if t == n]) for n in names}

    def single_task():
        bank.activate(names[0])
        return model(input_ids=ids, attention_mask=mask).logits

    def mixed():
        bank.restore_base()
        return mt(ids, mask, task_ids=task_ids).logits

    def wrapper_single():
        bank.restore_base()
        return mt(ids, mask, task_ids=single_ids).logits

    def per_task_groups():
        out = []
        for name, rows in groups.items():
            bank.activate(name)
            out.append(model(input_ids=ids[rows], attention_mask=mask[rows]).logits)
        return out

    configs = {"single-task batch (plain model)": single_task, f"mixed, {len(names)} tasks (MultiTaskModel)": mixed,
               "single task through MultiTaskModel": wrapper_single,
               f"one forward per task group ({len(names)} groups)": per_task_groups}
    keys = list(configs)
    times = {k: [] for k in keys}
    with torch.inference_mode():
        # correctness first: mixed rows against each task run separately
        got = mt(ids, mask, task_ids=task_ids).per_example()
        worst, agree = 0.0, True
        for name, rows in groups.items():
            bank.activate(name)
            want = model(input_ids=ids[rows], attention_mask=mask[rows]).logits
            for j, i in enumerate(rows.tolist()):
                worst = max(worst, float((got[i] - want[j]).abs().max()))
                agree &= int(got[i].argmax()) == int(want[j].argmax())
        bank.restore_base()
        for rep in range(warmup + reps):
            order = keys[rep % len(keys):] + keys[: rep % len(keys)]
            for key in order:
                t = time.perf_counter()
                configs[key]()
                if rep >= warmup:
                    times[key].append(time.perf_counter() - t)
    base_key = keys[0]
    rows = {}
    for key in keys:
        med = statistics.median(times[key])
        pairs = [b / t for b, t in zip(times[base_key], times[key])]
        rows[key] = {"median_s": med, "samples_per_s": batch / med, "throughput_vs_single": statistics.median(pairs),
                     "all_s": [round(t, 4) for t in times[key]]}
    return {"batch": batch, "seq": seq, "tasks": len(names), "reps": reps, "rows": rows,
            "max_abs_diff_vs_separate": worst, "argmax_identical": bool(agree)}


# --------------------------------------------------------------------------------------------------




def _size(x: int) -> str:
    return f"{x / 2**20:,.2f} MB" if x >= 2**20 else f"{x / 2**10:,.1f} KB"


def _dur(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def report(model_name: str, res: dict) -> str:
    lines = [f"**{MODELS[model_name]}**", ""]
    sizes = res.get("sizes")
    if sizes:
        full32, full16 = sizes["full_fp32_bytes"], sizes["full_fp16_bytes"]
        lines += ["| file | params | float32 | float16 | share of the full checkpoint (fp32 / fp16) |",
                  "| --- | ---: | ---: | ---: | ---: |",
                  f"| full checkpoint (`model.safetensors`) | {sizes['total_params']:,} | {_size(full32)} | {_size(full16)} | 100% |"]
        for terms in ("all", "paper-subset"):
            s = sizes[terms]
            lines.append(
                f"| BitFit `{terms}` adapter + 2-label head (`adapter_model.safetensors`) | {s['params']:,} "
                f"({s['bias_params']:,} biases) | {_size(s['fp32_bytes'])} | {_size(s['fp16_bytes'])} | "
                f"{100 * s['fp32_bytes'] / full32:.3f}% / {100 * s['fp16_bytes'] / full16:.3f}% |")
        lines.append("")
    sw = res.get("switching")
    if sw:
        lines += ["| switching the active task | time |", "| --- | ---: |",
                  f"| `AdapterBank.activate(name)`, {sw['adapters']} adapters loaded, {sw['tensors_swapped_per_switch']} tensors swapped (median of {sw['activate_reps']}; p90) | {_dur(sw['activate_median_s'])} ({_dur(sw['activate_p90_s'])}) |",
                  f"| `AdapterBank.restore_base()` | {_dur(sw['restore_base_median_s'])} |",
                  f"| `AdapterBank.add` (per adapter, incl. base check) | {_dur(sw['bank_add_s'])} |",
                  f"| load an adapter from disk onto the loaded backbone (`BitFitAdapter.from_pretrained(dir).apply_to(model)`) | {_dur(sw['load_adapter_from_disk_s'])} |",
                  f"| reload a full model from disk (`from_pretrained(checkpoint)`) | {_dur(sw['reload_full_model_s'])} |",
                  "",
                  f"Memory held by the bank for {sw['adapters']} adapters: {_size(sw['bank_adapter_bytes'])}. "
                  f"After `activate`, logits equal a fresh model with the adapter applied (max abs diff "
                  f"{sw['activate_max_abs_diff']:.1e}).", ""]
    mixed = res.get("mixed")
    if mixed:
        lines += [f"Inference, batch {mixed['batch']}, sequence {mixed['seq']}, {mixed['reps']} interleaved reps:", "",
                  "| configuration | median time / batch | samples/s | throughput vs single-task batch |",
                  "| --- | ---: | ---: | ---: |"]
        for key, row in mixed["rows"].items():
            lines.append(f"| {key} | {_dur(row['median_s'])} | {row['samples_per_s']:.1f} | {row['throughput_vs_single']:.3f}x |")
        lines += ["", f"Mixed batch against each task run separately: max abs logit difference "
                      f"{mixed['max_abs_diff_vs_separate']:.1e}, argmax identical: {mixed['argmax_identical']}.", ""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny random BERT, few repetitions")
    parser.add_argument("--models", default=None, help="comma list of: " + ", ".join(MODELS))
    parser.add_argument("--tasks", type=int, default=8, help="adapters loaded / tasks mixed (default 8)")
    parser.add_argument("--batch-size", type=int, default=None, help="inference batch (default 32; 16 for BERT-base)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 128)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved inference reps (default 8)")
    parser.add_argument("--switch-reps", type=int, default=None, help="activate() calls timed (default 2000)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    _quiet()

    quick = args.quick
    models = (args.models or ("tiny" if quick else "bert-base,minilm")).split(",")
    seq = args.seq or (16 if quick else 128)
    reps = args.reps or (2 if quick else 8)
    switch_reps = args.switch_reps or (100 if quick else 2000)
    info = machine_info()
    info["command"] = "python benchmarks/task_switching.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info["load_before"] = load_average()
    print(f"# task_switching: {info['cpu']}, {info['cpus']} CPUs, torch {info['torch']} ({info['torch_threads']} "
          f"threads), transformers {info['transformers']}; load {info['load_before']}", flush=True)
    results = {"machine": info, "models": {}}
    sections = []
    failures = []
    for model_name in models:
        batch = args.batch_size or (8 if quick else (16 if model_name == "bert-base" else 32))
        base = build_base(model_name)
        label_counts = [2, 3, 2, 5, 2, 4, 3, 2, 6, 2, 3, 7][: args.tasks]
        adapters = {f"task{i}": make_adapter(base, k, seed=100 + i) for i, k in enumerate(label_counts)}
        res = {}
        with tempfile.TemporaryDirectory(prefix="bitfit_switch_") as tmp:
            t0 = time.time()
            sizes = measure_sizes(base, tmp)
            res["switching"] = measure_switching(base, adapters, sizes.pop("full_dir"), sizes.pop("adapter_dir"),
                                                 switch_reps, 1 if quick else 3)
            res["sizes"] = sizes
        res["mixed"] = measure_mixed(base, adapters, batch, seq, reps, 1)
        res["load_after"] = load_average()
        print(f"  {model_name}: done in {time.time() - t0:.0f} s, load {res['load_after']}", flush=True)
        results["models"][model_name] = res
        text = report(model_name, res)
        sections.append(text)
        print("\n" + text, flush=True)
        if res["mixed"]["max_abs_diff_vs_separate"] > 1e-4 or not res["mixed"]["argmax_identical"]:
            failures.append(f"{model_name}: mixed batch differs from separate runs")
        if res["switching"]["activate_max_abs_diff"] > 1e-5:
            failures.append(f"{model_name}: activate() differs from a freshly applied adapter")
        del base
    info["load_after"] = load_average()
    text = footer(info)
    print(text, flush=True)
    write_outputs(args.json, args.markdown, results, "\n".join(sections) + "\n" + text)
    if failures:
        print("CORRECTNESS FAILURES: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
