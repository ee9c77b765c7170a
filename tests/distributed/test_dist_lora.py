"""BitFit + LoRA over 2 CPU processes (DDP, and DeepSpeed ZeRO-2): the same training as one process.

dist_train.py --method bitfit_lora trains every bias, the head and LoRA (r 4) on the query and value projections of the
small random BERT; LoRA dropout is off so that both runs draw no random masks.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import dist_harness as H  # noqa: E402

pytestmark = pytest.mark.distributed

KIND = "bert_bitfit_lora"


def _check_lora_trained(run) -> None:
    trained = H.trained(run.out, 0)
    assert any(".lora_A." in name for name in trained) and any(".lora_B." in name for name in trained)
    assert any(name.endswith(".base_layer.bias") for name in trained)  # biases of LoRA-wrapped modules


def test_ddp_bitfit_lora_trains_like_one_process():
    port = H.free_port()
    run = H.launch("ddp_lora", [H.accelerate_cmd("cpu_ddp.yaml", port, kind=KIND)], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="MULTI_CPU", kind=KIND)
    _check_lora_trained(run)
    H.record("ddp bitfit_lora accelerate cpu_ddp.yaml", numbers)


def test_zero2_bitfit_lora_trains_like_one_process():
    pytest.importorskip("deepspeed")
    port = H.free_port()
    run = H.launch("zero2_lora", [H.accelerate_cmd("cpu_deepspeed_zero2.yaml", port, kind=KIND)], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=2, kind=KIND)
    _check_lora_trained(run)
    H.record("deepspeed zero2 bitfit_lora accelerate cpu_deepspeed_zero2.yaml", numbers)
