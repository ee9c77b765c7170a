"""DDP over 2 CPU processes via accelerate_configs/cpu_ddp.yaml: trains what a single process trains.

Each launch takes seconds; the single-process reference runs once per session (dist_harness).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import dist_harness as H  # noqa: E402

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ddp_run():
    port = H.free_port()
    return H.launch("ddp", [H.accelerate_cmd("cpu_ddp.yaml", port, script_args=["--save-steps", "2"])], port=port)


def test_ddp_two_processes_train_like_one(ddp_run):
    numbers = H.verify_run(ddp_run, world_size=2, distributed_type="MULTI_CPU")
    H.record("ddp accelerate cpu_ddp.yaml", numbers)


def test_ddp_loss_not_scaled_by_world_size(ddp_run):
    """Trainer multiplies the loss by the world size for models it thinks normalise by num_items_in_batch
    (any forward with **kwargs, e.g. BertForSequenceClassification); BitFitTrainer turns that off."""
    losses = H.rank_report(ddp_run.out, 0)["losses"]
    ref = H.rank_report(H.reference_run(), 0)["losses"]
    assert max(abs(a / b - 1) for a, b in zip(losses, ref)) < H.LOSS_RTOL  # a scaled loss would be 2x


def test_ddp_resume_from_checkpoint(ddp_run):
    """Stop at step 2 (checkpoint-2: adapter + optimizer + scheduler + RNG), resume to step 4: the same
    parameters as the uninterrupted run, bit for bit."""
    assert ddp_run.ok, ddp_run.tail()
    checkpoint = ddp_run.out / "trainer" / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "optimizer.pt").is_file()
    port = H.free_port()
    resumed = H.launch("ddp_resume", [H.accelerate_cmd("cpu_ddp.yaml", port, script_args=["--resume", str(checkpoint)])],
                       port=port)
    H.verify_run(resumed, world_size=2, distributed_type="MULTI_CPU")
    assert [H.rank_report(resumed.out, r)["steps_run_here"] for r in (0, 1)] == [2, 2]
    diff = H.max_abs_diff(H.trained(resumed.out, 0), H.trained(ddp_run.out, 0))
    assert diff == 0.0, diff
    H.record("ddp resume from checkpoint-2", {"max_abs_diff_vs_uninterrupted": diff,
                                             "launch_seconds": round(resumed.seconds, 1)})


def test_ddp_trains_wrapped_after_an_evaluation_with_compiling_on():
    """With torch_compile on, the evaluation before training used to leave a compiled wrapper as the trainer's
    model, so training skipped DistributedDataParallel and the launch check stopped it. Evaluation now runs the
    plain module and training compiles under DDP: the ranks train what one process trains."""
    port = H.free_port()
    run = H.launch("ddp_compiled", [H.accelerate_cmd("cpu_ddp.yaml", port, script_args=["--compile", "aot_eager"])],
                   port=port)
    numbers = H.verify_run(run, world_size=2, distributed_type="MULTI_CPU")
    H.record("ddp with torch_compile (aot_eager) after an evaluation", numbers)
