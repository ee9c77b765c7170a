"""A tiny BitFit training run for the distributed tests; launched by python, torchrun, accelerate or deepspeed.

Every rank writes what it ended with into --out so the test (another process) can compare runs:

* ``rank{r}.json``: world size as seen by the Trainer's accelerator and by torch.distributed, the
  distributed type and ZeRO stage, logged losses / grad norms, optimizer groups, the frozen-parameter
  check against the base checkpoint (count of tensors that differ, max abs diff), timings;
* ``rank{r}_trained.safetensors``: the trained tensors (gathered under ZeRO-3);
* ``rank{r}_logits.safetensors``: logits of the trained model on a fixed batch (forward on all ranks);
* ``adapter/``: ``trainer.save_model()`` (the bias-only adapter, written by the main process).

Options mirror the knobs the tests need; the model is the small random BERT saved by the test at --base.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time

T0 = time.time()
faulthandler.enable()  # a rank that aborts (SIGABRT) prints where every Python thread was

import torch  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--base", required=True, help="directory of the base model (save_pretrained)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--save-steps", type=int, default=0)
    p.add_argument("--resume", default=None, help="checkpoint directory to resume from")
    p.add_argument("--ds-json", default=None, help="HF-style DeepSpeed JSON for TrainingArguments(deepspeed=...)")
    p.add_argument("--bias-lr", type=float, default=2e-2)
    p.add_argument("--head-lr", type=float, default=5e-3)
    p.add_argument("--no-helper", action="store_true", help="build TrainingArguments without training_args_kwargs")
    p.add_argument("--add-missing-biases", action="store_true", help="for bias-less bases (LLaMA): add zero biases")
    p.add_argument("--method", default="bitfit",
                   help="a registered method: bitfit, rand_uniform, rand_row_col, adapterbias, bitfit_lora (LoRA r 4, "
                        "no LoRA dropout: ranks draw no masks)")
    p.add_argument("--random-seed", type=int, default=0, help="seed of the random baselines' draw")
    p.add_argument("--share-alpha", action="store_true", help="with --method adapterbias: one shared L_alpha")
    p.add_argument("--eval-first", action="store_true", help="trainer.evaluate() before trainer.train(), as the recipes do")
    p.add_argument("--compile", default=None, metavar="BACKEND",
                   help="torch_compile with this backend (aot_eager: traced, no code generation)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1)  # the deepspeed launcher passes it
    return p.parse_args(argv)


def make_dataset(n, seq, vocab, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (n,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    # a learnable label: parity of the first token, so the loss moves
    labels = (ids[:, 1] % 2).long()
    return [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(n)]


def eval_batch(vocab, seq=16):
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(1, vocab, (4, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def method_config(a):
    """BitFit (the default) or another registered method, with the run's learning rates."""
    from bitfit_hf import BitFitConfig
    from bitfit_hf.tuners import method_spec
    from bitfit_hf.tuners.adapterbias import AdapterBiasConfig

    if a.method == "adapterbias":
        return AdapterBiasConfig(share_alpha=a.share_alpha, adapter_learning_rate=a.bias_lr, head_learning_rate=a.head_lr)
    kwargs = dict(bias_learning_rate=a.bias_lr, head_learning_rate=a.head_lr, add_missing_biases=a.add_missing_biases)
    if a.method == "bitfit":
        return BitFitConfig(**kwargs)
    if a.method == "bitfit_lora":
        from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

        return BitFitLoraConfig(**kwargs, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_learning_rate=a.bias_lr)
    return method_spec(a.method).config_class(random_seed=a.random_seed, **kwargs)


def main(argv=None) -> int:
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification, TrainingArguments

    from bitfit_hf import BitFitTrainer
    from bitfit_hf.training.backend import training_args_kwargs
    from bitfit_hf.training.launcher import launched_world_size
    from bitfit_hf.utils.zero import gathered

    t_import = time.time()
    world = launched_world_size()
    if a.global_batch % world:
        raise SystemExit(f"global batch {a.global_batch} is not divisible by world size {world}")
    kwargs = dict(
        output_dir=os.path.join(a.out, "trainer"),
        max_steps=a.steps,
        per_device_train_batch_size=a.global_batch // world,
        learning_rate=a.bias_lr,
        weight_decay=0.01,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        seed=0,
        logging_steps=1,
        save_strategy="steps" if a.save_steps else "no",
        save_steps=a.save_steps or 500,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        deepspeed=a.ds_json,
    )
    if a.compile:
        kwargs.update(torch_compile=True, torch_compile_backend=a.compile)
    args = TrainingArguments(**(kwargs if a.no_helper else training_args_kwargs(kwargs)))
    # TrainingArguments first, then the model: under ZeRO-3 (zero3_init_flag) it is built partitioned.
    model = AutoModelForSequenceClassification.from_pretrained(a.base)
    built_partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
    cfg = model.config
    data = make_dataset(a.steps * a.global_batch, 16, cfg.vocab_size)
    config = method_config(a)
    if a.method == "bitfit_lora":
        torch.manual_seed(0)  # lora_A's random init (peft): the same in the single-process reference
    trainer = BitFitTrainer(
        model,
        args,
        train_dataset=data,
        method_config=config,
    )
    from transformers import TrainerCallback

    class CountSteps(TrainerCallback):
        steps_run = 0

        def on_step_end(self, args, state, control, **kw):
            CountSteps.steps_run += 1

    trainer.add_callback(CountSteps())
    eval_before = trainer.evaluate(eval_dataset=data[:8])["eval_loss"] if a.eval_first else None
    t_setup = time.time()
    result = trainer.train(resume_from_checkpoint=a.resume)
    t_train = time.time()

    rank = trainer.args.process_index
    acc = trainer.accelerator
    import torch.distributed as dist

    # trained tensors (collective under ZeRO-3)
    trained = trainer.adapter_tensors()
    save_file(trained, os.path.join(a.out, f"rank{rank}_trained.safetensors"))

    # frozen parameters against the base checkpoint, gathered one by one under ZeRO-3
    base = load_file(os.path.join(a.base, "model.safetensors"))
    inner = trainer.model
    mismatched, max_diff, checked = [], 0.0, 0
    sparse = getattr(trainer.tuner_state, "sparse_indices", None) or {}
    if sparse:  # the random baselines: every rank's drawn entries, and their untrained entries checked below
        save_file({n: i.contiguous() for n, i in sparse.items()}, os.path.join(a.out, f"rank{rank}_indices.safetensors"))
    for name, param in inner.named_parameters():
        if name in sparse:  # trained in some entries: every other entry must be bit-identical to the base
            with gathered([param]):
                value = param.detach().to("cpu", torch.float32).reshape(-1).clone()
            untrained = torch.ones(value.numel(), dtype=torch.bool)
            untrained[sparse[name]] = False
            ref = base[name].to(torch.float32).reshape(-1)
            checked += 1
            if not torch.equal(value[untrained], ref[untrained]):
                mismatched.append(name)
                max_diff = max(max_diff, (value[untrained] - ref[untrained]).abs().max().item())
            continue
        if name in trained:
            continue
        with gathered([param]):
            value = param.detach().to("cpu", torch.float32).clone()
        ref = base[name.replace(".base_layer.", ".")].to(torch.float32)  # LoRA-wrapped modules: stock name
        checked += 1
        if value.shape != ref.shape or not torch.equal(value, ref):
            mismatched.append(name)
            if value.shape == ref.shape:
                max_diff = max(max_diff, (value - ref).abs().max().item())

    # logits of the trained model (all ranks run the forward: ZeRO-3 gathers inside)
    inner.eval()
    with torch.no_grad():
        logits = inner(**eval_batch(cfg.vocab_size)).logits.detach().to("cpu", torch.float32).contiguous()
    save_file({"logits": logits}, os.path.join(a.out, f"rank{rank}_logits.safetensors"))

    trainer.save_model(os.path.join(a.out, "adapter"))

    links, link = [], trainer.optimizer  # accelerate's wrapper, DeepSpeed's ZeRO wrapper, the optimizer itself
    while link is not None and len(links) < 5:
        links.append(link)
        link = getattr(link, "optimizer", None)
    chain = [type(link).__name__ for link in links]
    opt = next((link for link in links if hasattr(link, "param_groups")), links[-1])
    groups = [
        {"lr": g.get("initial_lr", g.get("lr")), "weight_decay": g.get("weight_decay")}
        for g in getattr(opt, "param_groups", [])
    ]
    plugin = getattr(acc.state, "deepspeed_plugin", None)
    zero_cfg = plugin.deepspeed_config.get("zero_optimization", {}) if plugin is not None else {}
    offload = {key: (zero_cfg.get(key) or {}).get("device") for key in ("offload_param", "offload_optimizer")}
    logs = trainer.state.log_history
    report = {
        "rank": rank,
        "accelerator_num_processes": acc.num_processes,
        "args_world_size": trainer.args.world_size,
        "dist_world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "env_world_size": world,
        "distributed_type": str(acc.distributed_type).split(".")[-1],
        "deepspeed": trainer.is_deepspeed_enabled,
        "zero_stage": getattr(plugin, "zero_stage", None) if plugin is not None else None,
        "built_partitioned": built_partitioned,
        "offload": offload,
        "global_step": trainer.state.global_step,
        "steps_run_here": CountSteps.steps_run,
        "losses": [e["loss"] for e in logs if "loss" in e],
        "grad_norms": [e["grad_norm"] for e in logs if "grad_norm" in e and e["grad_norm"] is not None],
        "train_loss": result.training_loss,
        "eval_loss_before": eval_before,
        "eval_loss_after": trainer.evaluate(eval_dataset=data[:8])["eval_loss"] if a.eval_first else None,
        "optimizer_chain": chain,
        "optimizer_groups": groups,
        "frozen_checked": checked,
        "frozen_mismatched": mismatched,
        "frozen_max_abs_diff": max_diff,
        "trained_tensors": len(trained),
        "seconds": {"import": t_import - T0, "setup": t_setup - t_import, "train": t_train - t_setup,
                    "total": time.time() - T0},
    }
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as handle:
        json.dump(report, handle, indent=1)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything this rank reports is on disk and its process group is destroyed. Interpreter teardown can
    # still abort a 2-process CPU run that trained correctly ("terminate called without an active
    # exception": a C++ thread destroyed while joinable, rare, seen on CI); the test judges a run by what
    # it wrote, so the worker leaves without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
