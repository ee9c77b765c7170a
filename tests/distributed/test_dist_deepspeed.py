"""DeepSpeed ZeRO-2 and ZeRO-3 over 2 CPU processes: the same training as one process, the same adapter.

The first DeepSpeed launch compiles DeepSpeed's shared-memory op (~1 min); it is cached in
TORCH_EXTENSIONS_DIR (default here: ~/.cache/bitfit_hf/torch_extensions), so later runs take seconds.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import dist_harness as H  # noqa: E402

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.distributed

# An HF-style DeepSpeed JSON that brings its own optimizer (torch's AdamW: no fused op to compile).
DS_OPTIMIZER_BLOCK = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto", "torch_adam": True}},
}


def test_zero2_accelerate_config():
    port = H.free_port()
    run = H.launch("zero2", [H.accelerate_cmd("cpu_deepspeed_zero2.yaml", port)], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=2)
    H.record("deepspeed zero2 accelerate cpu_deepspeed_zero2.yaml", numbers)


def test_zero2_optimizer_block_keeps_bitfit_groups():
    """A DeepSpeed config with an "optimizer" block: DeepSpeed builds that optimizer, over BitFit's groups
    (biases lr 2e-2 without weight decay, head lr 5e-3): the result equals the single-process run. Without
    bitfit-hf's handling DeepSpeed trains one group (lr 2e-2, decay on every bias), ~4e-2 off."""
    path = H.workdir() / "ds_optimizer_block.json"
    path.write_text(json.dumps(DS_OPTIMIZER_BLOCK))
    port = H.free_port()
    run = H.launch("zero2_optimizer_block", [H.torchrun_cmd(2, port, ["--ds-json", str(path)])], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=2)
    H.record("deepspeed zero2 + optimizer block (torchrun, TrainingArguments(deepspeed=json))", numbers)


@pytest.fixture(scope="module")
def zero3_run():
    port = H.free_port()
    return H.launch("zero3", [H.accelerate_cmd("cpu_deepspeed_zero3.yaml", port, script_args=["--save-steps", "2"])],
                    port=port)


def test_zero3_accelerate_config(zero3_run):
    """ZeRO-3 with zero3_init_flag: the model is built partitioned; the adapter save gathers only the trained
    tensors and writes the same adapter (same tensors within tolerance, same config and base fingerprint)
    as a single-process run."""
    numbers = H.verify_run(zero3_run, world_size=2, distributed_type="DEEPSPEED", zero_stage=3)
    assert numbers["built_partitioned"] is True
    H.record("deepspeed zero3 accelerate cpu_deepspeed_zero3.yaml", numbers)


def test_zero3_resume_from_checkpoint(zero3_run):
    assert zero3_run.ok, zero3_run.tail()
    checkpoint = zero3_run.out / "trainer" / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert list(checkpoint.glob("global_step2/*optim_states.pt")), "no DeepSpeed checkpoint was written"
    port = H.free_port()
    resumed = H.launch("zero3_resume", [H.accelerate_cmd("cpu_deepspeed_zero3.yaml", port,
                                                         script_args=["--resume", str(checkpoint)])], port=port)
    H.verify_run(resumed, world_size=2, distributed_type="DEEPSPEED", zero_stage=3)
    assert [H.rank_report(resumed.out, r)["steps_run_here"] for r in (0, 1)] == [2, 2]
    diff = H.max_abs_diff(H.trained(resumed.out, 0), H.trained(zero3_run.out, 0))
    assert diff == 0.0, diff
    H.record("deepspeed zero3 resume from checkpoint-2", {"max_abs_diff_vs_uninterrupted": diff,
                                                         "launch_seconds": round(resumed.seconds, 1)})


def test_zero3_cpu_offload_config():
    """The shipped ZeRO-3 offload config (parameters and optimizer state in CPU RAM), on 2 CPU processes:
    DeepSpeed's CPU Adam runs BitFit's optimizer groups and the result equals the single-process run. The
    first run compiles DeepSpeed's cpu_adam op (minutes; cached in TORCH_EXTENSIONS_DIR)."""
    port = H.free_port()
    run = H.launch("zero3_offload", [H.accelerate_cmd("deepspeed_zero3_offload.yaml", port, "--num_processes", "2")],
                   port=port, timeout=max(H.LAUNCH_TIMEOUT, 1200))  # room for compiling cpu_adam on 2 cores
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=3)
    report = H.rank_report(run.out, 0)
    assert report["offload"] == {"offload_param": "cpu", "offload_optimizer": "cpu"}, report["offload"]
    assert report["optimizer_chain"][-1] == "DeepSpeedCPUAdam", report["optimizer_chain"]
    assert numbers["built_partitioned"] is True
    H.record("deepspeed zero3 + CPU offload (deepspeed_zero3_offload.yaml --num_processes 2)", numbers)


def test_zero3_llama_with_added_biases():
    """A bias-less architecture (LLaMA) under ZeRO-3 built partitioned: BitFit adds zero biases (native on
    Linear, a forward hook on RMSNorm) to partitioned modules, trains them like one process does, and saves an
    adapter that a stock LLaMA loads (the biases are added again on load) with the same logits."""
    port = H.free_port()
    run = H.launch("zero3_llama", [H.accelerate_cmd("cpu_deepspeed_zero3.yaml", port, kind="llama")], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=3, kind="llama")
    assert numbers["built_partitioned"] is True
    H.record("deepspeed zero3 llama + added biases (cpu_deepspeed_zero3.yaml)", numbers)
