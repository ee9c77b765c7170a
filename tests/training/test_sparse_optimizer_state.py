"""A method that trains some entries of weight matrices (the random baselines) checkpoints the optimizer state of
those entries only: ``optimizer.pt`` is about the size of BitFit's, not of a dense state for every matrix touched
(86 MB instead of ~170 KB on all-MiniLM-L6-v2, measured in docs/reliability.md), and a resume restores the dense
state exactly (the untrained entries' moments are zero) and ends bit-identical to the uninterrupted run."""

from __future__ import annotations

import os

import pytest
import torch
import transformers as T
from conftest import tiny_model
from datasets import Dataset

from bitfit_hf import BitFitConfig, BitFitTrainer
from bitfit_hf.tuners.random_subset import RandRowColConfig, RandUniformConfig


def _dataset(n=32):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (n, 10), generator=g)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 10] * n,
                              "labels": torch.randint(0, 3, (n,), generator=g).tolist()})


def _run(out, config, max_steps=4, resume=None):
    args = T.TrainingArguments(str(out), max_steps=max_steps, per_device_train_batch_size=8, learning_rate=1e-2,
                               save_strategy="steps", save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True,
                               logging_strategy="no", seed=0, weight_decay=0.01)
    model = tiny_model("bert").train()
    trainer = BitFitTrainer(model, args, train_dataset=_dataset(), method_config=config)
    trainer.train(resume_from_checkpoint=resume)
    return model, trainer


@pytest.mark.parametrize("config", [RandUniformConfig(random_seed=3), RandRowColConfig(random_seed=4)],
                         ids=["rand_uniform", "rand_row_col"])
def test_the_optimizer_state_of_a_sparse_selection_is_compact_and_resumes_exactly(tmp_path, config):
    full, trainer = _run(tmp_path / "full", config)
    state = trainer.tuner_state
    sparse_numel = sum(p.numel() for n, p in full.named_parameters() if n in state.sparse_indices)
    size = os.path.getsize(tmp_path / "full" / "checkpoint-2" / "optimizer.pt")
    dense_moments = 2 * 4 * sparse_numel  # exp_avg + exp_avg_sq, float32, of every matrix touched
    _, bitfit = _run(tmp_path / "bitfit", BitFitConfig(), max_steps=2)
    bitfit_size = os.path.getsize(tmp_path / "bitfit" / "checkpoint-2" / "optimizer.pt")
    assert size < dense_moments / 4, (size, dense_moments)
    assert size < 2 * bitfit_size + 20_000, (size, bitfit_size)  # about BitFit's, as many scalars are trained

    resumed, resumed_trainer = _run(tmp_path / "resumed", config, resume=str(tmp_path / "full" / "checkpoint-2"))
    theirs = dict(full.named_parameters())
    for name, param in resumed.named_parameters():
        assert torch.equal(param, theirs[name]), name
    # the optimizer's state after the resumed run is the dense one, equal to the uninterrupted run's
    mine, reference = _moments(resumed_trainer, resumed), _moments(trainer, full)
    assert mine.keys() == reference.keys() and mine
    for name, entry in reference.items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(mine[name][key]), torch.as_tensor(value)), (name, key)


def _moments(trainer, model):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: dict(s) for p, s in trainer.optimizer.state.items()}
