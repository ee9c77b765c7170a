"""The random baselines (rand_uniform, rand_row_col) over 2 CPU processes: every rank draws the same entries,
every untrained entry stays bit-identical to the base, and the result equals the single-process run, under
DDP and DeepSpeed ZeRO-2; ZeRO-3 is refused with a clear error."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import dist_harness as H  # noqa: E402

pytestmark = pytest.mark.distributed


def _same_draw_everywhere(out, world_size: int, kind: str) -> None:
    reference = H.drawn_indices(H.reference_run(kind), 0)
    assert reference
    for rank in range(world_size):
        drawn = H.drawn_indices(out, rank)
        assert drawn.keys() == reference.keys()
        for name, indices in drawn.items():
            assert torch.equal(indices, reference[name]), f"rank {rank} drew other entries of {name}"


@pytest.mark.parametrize("kind", ["bert_rand_uniform", "bert_rand_row_col"])
def test_ddp_random_baseline_trains_like_one_process(kind):
    port = H.free_port()
    run = H.launch(f"ddp_{kind}", [H.accelerate_cmd("cpu_ddp.yaml", port, kind=kind)], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="MULTI_CPU", kind=kind)
    _same_draw_everywhere(run.out, 2, kind)
    H.record(f"ddp accelerate cpu_ddp.yaml {kind}", numbers)


def test_zero2_random_baseline_trains_like_one_process():
    pytest.importorskip("deepspeed")
    kind = "bert_rand_uniform"
    port = H.free_port()
    run = H.launch(f"zero2_{kind}", [H.accelerate_cmd("cpu_deepspeed_zero2.yaml", port, kind=kind)], port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="DEEPSPEED", zero_stage=2, kind=kind)
    _same_draw_everywhere(run.out, 2, kind)
    H.record(f"deepspeed zero2 accelerate cpu_deepspeed_zero2.yaml {kind}", numbers)


def test_zero3_refuses_the_random_baselines():
    pytest.importorskip("deepspeed")
    port = H.free_port()
    run = H.launch("zero3_rand", [H.accelerate_cmd("cpu_deepspeed_zero3.yaml", port, kind="bert_rand_uniform")],
                   port=port)
    assert not run.ok
    assert "rand_uniform under DeepSpeed ZeRO-3 is not supported" in run.log, run.tail()
