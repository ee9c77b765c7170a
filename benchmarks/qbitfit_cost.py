#!/usr/bin/env python
"""QBitFit against (Q)LoRA on one decoder base: GPU memory and step time, plus the QBitFit checks that
need a GPU (bitsandbytes).

The base is a randomly initialised LLaMA of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads / 3
key-value heads, FFN 1536, vocabulary 49,152, tied embeddings), saved once in bf16; costs depend on the
shapes, not on the values. Every configuration loads that checkpoint afresh in the same process, trains
causal-LM steps on random tokens with a plain AdamW loop (no Trainer, so only the method differs), and
is measured as:

* ``weights MiB``: GPU memory allocated once the model is loaded and prepared;
* ``peak MiB``: the peak allocated during the timed steps (weights, activations, gradients, AdamW state);
* ``step ms``: median over the timed steps of forward + backward + optimizer step (CUDA-synchronised).

Configurations: ``qbitfit`` (4-bit NF4 base, bf16 compute, BitFit on every role with added float32
biases), ``qlora`` (the same 4-bit base, PEFT LoRA r=8 on the seven projections), ``bitfit`` and
``lora`` on the bf16 base, ``full`` fine-tuning of the bf16 base.

``--checks`` also runs the GPU checks of QBitFit: ``BitFitTrainer`` on the 4-bit and the 8-bit base
without any flag, frozen 4-bit weights bit-identical after training, biases float32, the saved adapter
rebuilt by ``AutoBitFitModel.from_pretrained`` with identical logits, and the 4-bit adapter accepted on
the bf16 base (same base loaded another way) but refused on another random base.

    python benchmarks/qbitfit_cost.py --device cuda --checks --json out.json --markdown out.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

CONFIGS = ("qbitfit", "qlora", "bitfit", "lora", "full")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def smollm2_shape_config(layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


def save_random_base(path: str, layers: int, seed: int) -> None:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(smollm2_shape_config(layers)).to(torch.bfloat16)
    model.save_pretrained(path)


def load(path: str, bits: int, device: str):
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    if bits == 4:
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                                   bnb_4bit_use_double_quant=True)
        return LlamaForCausalLM.from_pretrained(path, quantization_config=quant, dtype=torch.bfloat16, device_map={"": 0})
    if bits == 8:
        return LlamaForCausalLM.from_pretrained(path, quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                                dtype=torch.bfloat16, device_map={"": 0})
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device)


def prepare(name: str, path: str, device: str):
    """The model of configuration ``name``, ready to train, and its trainable parameters."""
    from bitfit_hf import BitFitConfig, apply_bitfit

    model = load(path, 4 if name in ("qbitfit", "qlora") else 16, device)
    if name in ("qbitfit", "bitfit"):
        apply_bitfit(model, BitFitConfig("all", add_missing_biases=True))
    elif name in ("qlora", "lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, lora_dropout=0.0,
                                                 bias="none", task_type="CAUSAL_LM"))
    else:
        model.requires_grad_(True)
    model.train()
    return model, [p for p in model.parameters() if p.requires_grad]


def measure(name: str, path: str, args) -> dict:
    device = args.device
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_allocated = torch.cuda.memory_allocated()
    model, params = prepare(name, path, device)
    weights = torch.cuda.memory_allocated() - base_allocated
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    generator = torch.Generator().manual_seed(0)
    times = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, 49152, (args.batch_size, args.seq_len), generator=generator).to(device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() - base_allocated
    result = {
        "config": name,
        "trainable_params": sum(p.numel() for p in params),
        "trainable_dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params}),
        "weights_mib": weights / 2**20,
        "peak_mib": peak / 2**20,
        "step_ms": 1000 * statistics.median(times),
        "step_ms_all": [1000 * t for t in times],
        "tokens_per_s": args.batch_size * args.seq_len / statistics.median(times),
        "final_loss": float(loss),
    }
    del model, params, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return result


# ---- checks ---------------------------------------------------------------------------------------
def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().cpu()


def run_checks(path: str, other_path: str, device: str) -> dict:
    from transformers import TrainingArguments

    from bitfit_hf import AutoBitFitModel, BitFitConfig, BitFitTrainer
    from bitfit_hf.adapters.adapter import BitFitAdapter
    from bitfit_hf.adapters.config import BaseModelMismatchError

    results = {}
    ids = torch.randint(0, 49152, (2, 32), generator=torch.Generator().manual_seed(1)).to(device)
    data = [{"input_ids": row, "labels": row} for row in
            torch.randint(0, 49152, (16, 64), generator=torch.Generator().manual_seed(2)).tolist()]
    for bits in (4, 8):
        model = load(path, bits, device)
        frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
        before = _logits(model, ids)
        out = tempfile.mkdtemp(prefix=f"qbitfit{bits}-")
        trainer = BitFitTrainer(
            model=model, args=TrainingArguments(out, max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2,
                                                report_to=[], save_strategy="no", logging_steps=1),
            train_dataset=data, method_config=BitFitConfig("all", add_missing_biases=True))
        unchanged = torch.equal(_logits(model, ids), before)
        trainer.train()
        trainer.save_model(out)
        after = _logits(model, ids)
        params = dict(model.named_parameters())
        trained = set(trainer.tuner_state.selection.parameter_names)
        frozen_same = all(torch.equal(params[n], t) for n, t in frozen.items() if n not in trained)
        reloaded = AutoBitFitModel.from_pretrained(out)
        cfg = BitFitAdapter.from_pretrained(out).config
        results[f"{bits}bit"] = {
            "quant_method": cfg.base_loading.get("quant_method"),
            "recorded_loading": {k: v for k, v in cfg.base_loading.get("quantization_config", {}).items()
                                 if k in ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_compute_dtype")},
            "outputs_unchanged_before_training": unchanged,
            "logits_moved": not torch.equal(after, before),
            "frozen_weights_bit_identical": frozen_same,
            "trained_dtypes": sorted({str(params[n].dtype) for n in trained}),
            "reloaded_is_quantized": bool(getattr(reloaded, "is_quantized", False)),
            "reload_logits_identical": torch.equal(_logits(reloaded, ids), after),
            "adapter_tensors": len(cfg.adapter_parameters),
        }
        if bits == 4:
            full = AutoBitFitModel.from_pretrained(out, base_model=path, quantization_config=None, dtype=torch.bfloat16)
            results["4bit"]["accepted_on_bf16_base"] = True
            results["4bit"]["bf16_vs_4bit_logit_corr"] = float(torch.corrcoef(torch.stack(
                [_logits(full.to(device), ids).flatten(), after.flatten()]))[0, 1])
            try:
                AutoBitFitModel.from_pretrained(out, base_model=other_path, quantization_config=None, dtype=torch.bfloat16)
                results["4bit"]["refused_on_other_base"] = False
            except BaseModelMismatchError as err:
                results["4bit"]["refused_on_other_base"] = str(err)[-160:]
        del model, trainer, reloaded
        gc.collect()
        torch.cuda.empty_cache()
    return results


def markdown(rows, meta) -> str:
    by_name = {r["config"]: r for r in rows}
    lines = ["| config | trainable params | trainable dtype | weights MiB | peak MiB | step ms | tokens/s |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['trainable_params']:,} | {'/'.join(r['trainable_dtypes'])} | "
                     f"{r['weights_mib']:.0f} | {r['peak_mib']:.0f} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} |")
    if "qbitfit" in by_name and "qlora" in by_name:
        q, l = by_name["qbitfit"], by_name["qlora"]
        lines.append("")
        lines.append(f"QBitFit / QLoRA: peak memory {q['peak_mib'] / l['peak_mib']:.2f}x, step time "
                     f"{q['step_ms'] / l['step_ms']:.2f}x.")
    lines.append("")
    lines.append(f"{meta['device_name']}, torch {meta['torch']}, transformers {meta['transformers']}, peft {meta['peft']}, "
                 f"bitsandbytes {meta['bitsandbytes']}; batch {meta['batch_size']} x {meta['seq_len']} tokens, "
                 f"{meta['steps']} timed steps after {meta['warmup']} warm-up; `{meta['command']}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--checks", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this benchmark measures bitsandbytes 4-bit bases, which need a CUDA GPU", file=sys.stderr)
        return 2
    import bitsandbytes
    import peft
    import transformers

    workdir = tempfile.mkdtemp(prefix="qbitfit-bench-")
    path, other = os.path.join(workdir, "base"), os.path.join(workdir, "other")
    save_random_base(path, args.layers, seed=0)
    save_random_base(other, args.layers, seed=1)
    rows = []
    for name in args.configs.split(","):
        rows.append(measure(name, path, args))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "step_ms_all"}), flush=True)
    checks = run_checks(path, other, args.device) if args.checks else {}
    if checks:
        print(json.dumps(checks, indent=1), flush=True)
    meta = {"device_name": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__, "python": platform.python_version(),
            "batch_size": args.batch_size, "seq_len": args.seq_len, "steps": args.steps, "warmup": args.warmup,
            "command": "python benchmarks/qbitfit_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    table = markdown(rows, meta)
    print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"meta": meta, "rows": rows, "checks": checks}, handle, indent=1)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
