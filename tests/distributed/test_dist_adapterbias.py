"""AdapterBias under DDP over 2 CPU processes (accelerate_configs/cpu_ddp.yaml): the same trained shift,
LayerNorms and head as the single-process run of the same global batch, every frozen tensor untouched,
and an adapter that reproduces the logits on a stock model (dist_harness.verify_run checks all of it)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import dist_harness as H  # noqa: E402

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("kind", ["bert_adapterbias", "bert_adapterbias_shared"])
def test_ddp_two_processes_train_adapterbias_like_one(kind):
    port = H.free_port()
    run = H.launch(f"ddp_{kind}", [H.accelerate_cmd("cpu_ddp.yaml", port, kind=kind)], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="MULTI_CPU", kind=kind)
    trained = H.trained(run.out, 0)
    assert any(n.endswith("token_shift.vector") for n in trained), sorted(trained)[:5]
    H.record(f"ddp accelerate cpu_ddp.yaml, {kind}", numbers)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_trains_adapterbias_like_one_process(stage):
    """Under ZeRO-3 the model is built partitioned and the shifts are inserted afterwards: DeepSpeed
    partitions them with the rest and gathers them when the shift module runs."""
    pytest.importorskip("deepspeed")
    kind = "bert_adapterbias_shared" if stage == 3 else "bert_adapterbias"
    port = H.free_port()
    run = H.launch(f"zero{stage}_{kind}", [H.accelerate_cmd(f"cpu_deepspeed_zero{stage}.yaml", port, kind=kind)],
                   port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=stage, kind=kind)
    H.record(f"deepspeed zero{stage} accelerate cpu_deepspeed_zero{stage}.yaml, {kind}", numbers)
