"""A process killed while writing a checkpoint never breaks the resume: ``resume_from_checkpoint=True``
(``--resume_from_checkpoint last``) takes the newest *complete* checkpoint and ends exactly where the
uninterrupted run ends; naming an incomplete checkpoint, or having none, is a clear error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from reliability_support import REPO, python_env, same_tensors, tiny_bert

from bitfit_hf import BitFitTrainer
from bitfit_hf.training import trainer as trainer_module
from bitfit_hf.training.checkpoints import CheckpointError, last_complete_checkpoint
from bitfit_hf.utils.constants import CHECKPOINT_COMPLETE_NAME, WEIGHTS_NAME
from bitfit_hf.utils.errors import UserError


class Killed(BaseException):
    """Stands for the process dying: nothing after the raise point runs, files stay as they are."""


def dataset(n: int = 48, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (n, 10), generator=g)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 10] * n,
                              "labels": torch.randint(0, 2, (n,), generator=g).tolist()})


def make_trainer(out, **overrides) -> BitFitTrainer:
    import transformers as T

    kwargs = dict(max_steps=6, per_device_train_batch_size=8, learning_rate=1e-2, save_strategy="steps", save_steps=2,
                  report_to=[], use_cpu=True, disable_tqdm=True, seed=0, logging_strategy="no")
    kwargs.update(overrides)
    return BitFitTrainer(tiny_bert(seed=0).train(), T.TrainingArguments(str(out), **kwargs), train_dataset=dataset())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("reference"))
    trainer.train()
    return trainer.adapter_tensors()


def kill_at(monkeypatch, trainer, where: str, step: int = 4) -> None:
    """Make the checkpoint of ``step`` die at ``where``."""
    def dying(original):
        def run(*args, **kwargs):
            if trainer.state.global_step == step:
                if where == "save_model":
                    os.makedirs(args[0], exist_ok=True)  # the folder exists, nothing is in it yet
                raise Killed(where)
            return original(*args, **kwargs)
        return run

    if where == "mark_complete":
        monkeypatch.setattr(trainer_module, "mark_complete", dying(trainer_module.mark_complete))
    else:
        monkeypatch.setattr(trainer, where, dying(getattr(trainer, where)))


@pytest.mark.parametrize("where", ["save_model", "_save_optimizer_and_scheduler", "_save_rng_state", "mark_complete"])
def test_resume_last_skips_the_checkpoint_being_written(tmp_path, monkeypatch, uninterrupted, where):
    out = tmp_path / "run"
    first = make_trainer(out)
    kill_at(monkeypatch, first, where)
    with pytest.raises(Killed):
        first.train()
    monkeypatch.undo()
    assert os.path.isdir(out / "checkpoint-4") and not os.path.exists(out / "checkpoint-4" / CHECKPOINT_COMPLETE_NAME)
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-2")

    resumed = make_trainer(out)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6
    assert same_tensors(resumed.adapter_tensors(), uninterrupted)  # as if never killed
    assert all(os.path.isfile(out / f"checkpoint-{s}" / CHECKPOINT_COMPLETE_NAME) for s in (2, 4, 6))


def test_rotation_waits_for_the_new_checkpoint_to_be_complete(tmp_path, monkeypatch):
    out = tmp_path / "run"
    first = make_trainer(out, save_total_limit=1)
    kill_at(monkeypatch, first, "mark_complete")
    with pytest.raises(Killed):
        first.train()
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-2")  # not rotated away
    monkeypatch.undo()
    resumed = make_trainer(out, save_total_limit=1)
    resumed.train(resume_from_checkpoint=True)
    assert sorted(os.listdir(out)) == ["checkpoint-6"]


def test_naming_an_incomplete_checkpoint_or_having_none_is_a_clear_error(tmp_path, monkeypatch):
    out = tmp_path / "run"
    first = make_trainer(out)
    kill_at(monkeypatch, first, "save_model", step=2)
    with pytest.raises(Killed):
        first.train()
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"no complete checkpoint to resume from .*checkpoint-2 was interrupted"):
        make_trainer(out).train(resume_from_checkpoint=True)
    (out / "checkpoint-4").mkdir()
    (out / "checkpoint-2" / CHECKPOINT_COMPLETE_NAME).write_text("{}")  # pretend 2 completed
    with pytest.raises(CheckpointError, match=r"checkpoint-4' is incomplete .*resume from .*checkpoint-2"):
        make_trainer(out).train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert issubclass(CheckpointError, UserError)


def test_checkpoints_written_before_markers_existed_still_resume(tmp_path):
    out = tmp_path / "run"
    make_trainer(out, max_steps=4).train()
    for step in (2, 4):
        os.remove(out / f"checkpoint-{step}" / CHECKPOINT_COMPLETE_NAME)
    (out / "checkpoint-6").mkdir()  # an empty newer folder, as an old version's kill left it
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-4")


KILLED_RUN = """
import os, sys
sys.path.insert(0, "tests/reliability")
from test_kills_during_checkpointing import make_trainer
trainer = make_trainer(sys.argv[1])
original = trainer._save_optimizer_and_scheduler
def die(folder):
    if trainer.state.global_step == 4:
        open(os.path.join(folder, "optimizer.pt"), "wb").write(b"half")  # a torch.save cut short
        os._exit(9)  # the process dies here, as under SIGKILL: no handler, no cleanup
    return original(folder)
trainer._save_optimizer_and_scheduler = die
trainer.train()
"""


@pytest.mark.slow
def test_a_process_that_dies_mid_checkpoint_resumes_from_the_last_complete_one(tmp_path, uninterrupted):
    out = tmp_path / "run"
    threads = str(torch.get_num_threads())  # the same arithmetic as this process's reference run
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(out)], cwd=REPO,
                          env=python_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert os.path.isfile(out / "checkpoint-4" / WEIGHTS_NAME)  # the adapter was written, the rest was not
    resumed = make_trainer(out)
    resumed.train(resume_from_checkpoint=True)
    assert same_tensors(resumed.adapter_tensors(), uninterrupted)
