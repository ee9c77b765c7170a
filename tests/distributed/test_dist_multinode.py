"""Two simulated machines on one box: two launcher processes, machine_rank 0 and 1, 127.0.0.1, static
rendezvous, one CPU process each; for DDP and for DeepSpeed (ZeRO-3 via the launcher's flags)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import dist_harness as H  # noqa: E402

pytestmark = pytest.mark.distributed


def test_two_node_ddp():
    port = H.free_port()
    commands = [H.accelerate_cmd("cpu_two_node_ddp.yaml", port, "--machine_rank", str(rank)) for rank in (0, 1)]
    run = H.launch("two_node_ddp", commands, port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="MULTI_CPU")
    H.record("two-node ddp (cpu_two_node_ddp.yaml, machine_rank 0/1)", numbers)


def test_two_node_deepspeed_zero3():
    pytest.importorskip("deepspeed")
    port = H.free_port()
    commands = [
        H.accelerate_cmd("cpu_two_node_deepspeed.yaml", port, "--machine_rank", str(rank), "--zero_stage", "3",
                         "--zero3_init_flag", "true")
        for rank in (0, 1)
    ]
    run = H.launch("two_node_zero3", commands, port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=3)
    assert numbers["built_partitioned"] is True
    H.record("two-node deepspeed zero3 (cpu_two_node_deepspeed.yaml --zero_stage 3)", numbers)
