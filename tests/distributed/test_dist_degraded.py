"""Launches that exit 0 while training wrongly (see docs/distributed.md) now stop with an error naming the
cause, before any training step."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import dist_harness as H  # noqa: E402

pytestmark = pytest.mark.distributed

MULTI_CPU = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
num_machines: {machines}
num_processes: 2
machine_rank: 0
main_process_ip: 127.0.0.1
mixed_precision: 'no'
use_cpu: true
main_training_function: main
"""


def _stopped(run, *phrases):
    assert run.returncodes and all(rc != 0 for rc in run.returncodes), f"expected a failure:\n{run.tail()}"
    assert "LaunchError" in run.log, run.tail()
    for phrase in phrases:
        assert phrase in run.log, f"{phrase!r} not in:\n{run.tail(30)}"
    assert not list(run.out.glob("rank*.json")), "training ran although the launch was degraded"


def test_multi_cpu_config_runs_one_process_and_is_stopped():
    """distributed_type MULTI_CPU without mpirun: accelerate starts ONE process (exit 0 before)."""
    cfg = H.workdir() / "multi_cpu.yaml"
    cfg.write_text(MULTI_CPU.format(machines=1))
    run = H.launch("degraded_multi_cpu", [H.accelerate_cmd(str(cfg), H.free_port())])
    _stopped(run, "asked for 2 processes", "runs 1 process(es)", "MULTI_CPU", "mpirun")


def test_two_node_multi_cpu_each_node_alone_is_stopped():
    """Two "machines" with MULTI_CPU: each launcher runs one process that trains alone (both exit 0 before)."""
    cfg = H.workdir() / "multi_cpu_two_node.yaml"
    cfg.write_text(MULTI_CPU.format(machines=2))
    port = H.free_port()
    commands = [H.accelerate_cmd(str(cfg), port, "--machine_rank", str(rank)) for rank in (0, 1)]
    run = H.launch("degraded_two_node_multi_cpu", commands, port=port)
    _stopped(run, "asked for 2 processes", "num_machines 2", "MULTI_CPU")
    assert run.log.count("LaunchError:") >= 2  # each "node" stops


def test_accelerate_use_cpu_with_deepspeed_is_stopped():
    """ACCELERATE_USE_CPU=true with a DeepSpeed config switches DeepSpeed off (plain DDP trained, exit 0)."""
    pytest.importorskip("deepspeed")
    port = H.free_port()
    run = H.launch("degraded_use_cpu_deepspeed", [H.accelerate_cmd("cpu_deepspeed_zero2.yaml", port)],
                   env_extra={"ACCELERATE_USE_CPU": "true"}, port=port)
    _stopped(run, "DeepSpeed was requested", "without DeepSpeed", "ACCELERATE_USE_CPU=true")


def test_torchrun_with_use_cpu_false_on_cpu_machine_is_stopped():
    """TrainingArguments(use_cpu=False) without CUDA under torchrun: each rank trained alone (exit 0)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    port = H.free_port()
    run = H.launch("degraded_no_use_cpu", [H.torchrun_cmd(2, port, ["--no-helper"])], port=port)
    _stopped(run, "WORLD_SIZE=2", "use_cpu=False", "training_args_kwargs")


def test_deepspeed_scheduler_block_with_group_learning_rates_is_refused():
    """A DeepSpeed "scheduler" block sets one lr on every group: refused when BitFit's groups differ."""
    pytest.importorskip("deepspeed")
    cfg = {
        "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": "auto", "warmup_num_steps": 0}},
    }
    path = H.workdir() / "ds_scheduler_block.json"
    path.write_text(json.dumps(cfg))
    run = H.launch("refused_scheduler_block", [H.python_cmd(["--ds-json", str(path)])])
    _stopped(run, '"scheduler" block (WarmupLR)', "bias_learning_rate")
