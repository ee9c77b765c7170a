"""The collapse check: ``CollapseCallback`` on synthetic log histories (each rule, its patience, what does
not count), on real ``Trainer`` runs of a tiny BERT (a rate that collapses is reported within the first epoch, a
healthy rate is not), and the constant-level and constant-prediction helpers."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
import transformers as T
from datasets import Dataset

from bitfit_hf.training.collapse import (
    CollapseCallback,
    ConstantLoss,
    label_entropy,
    label_variance,
    token_constant_loss,
    warn_if_constant,
)

LN2 = math.log(2)
LOGGER = "bitfit_hf.training.collapse"


def _args(tmp_path, **overrides) -> T.TrainingArguments:
    base = dict(output_dir=str(tmp_path / "out"), learning_rate=3e-3, logging_steps=10, report_to=[], use_cpu=True,
                save_strategy="no", disable_tqdm=True)
    base.update(overrides)
    return T.TrainingArguments(**base)


def _drive(callback, args, losses, max_steps=100, epochs=1, world_zero=True, grad_norms=None, every=10):
    """Train begin, then one training log per entry of ``losses`` at steps every, 2·every, ... (as Trainer logs)."""
    state = T.TrainerState(max_steps=max_steps, num_train_epochs=epochs, is_world_process_zero=world_zero)
    control = T.TrainerControl()
    callback.on_train_begin(args, state, control)
    for i, loss in enumerate(losses):
        state.global_step = every * (i + 1)
        logs = {"loss": loss, "learning_rate": args.learning_rate, "epoch": state.global_step / max_steps}
        if grad_norms is not None:
            logs["grad_norm"] = grad_norms[i]
        callback.on_log(args, state, control, logs=logs)
    return callback.report


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# --------------------------------------------------------------------------- synthetic histories


def test_a_loss_flat_at_the_constant_level_is_reported_once_after_patience(tmp_path, caplog):
    callback = CollapseCallback(ConstantLoss(LN2, "the entropy of the training labels"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        report = _drive(callback, _args(tmp_path), [0.71, 0.69, 0.70, 0.72, 0.69, 0.70])
    assert report is not None and report.kind == "constant" and report.step == 30  # the third flat log
    [message] = _warnings(caplog)  # once, though three more flat logs followed
    assert "10-30: loss 0.71, 0.69, 0.7" in message and "0.6931, the entropy of the training labels" in message
    assert "--learning_rate than this run's 0.003" in message and "a third of it, 0.001," in message
    started = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]
    assert any("first such warning can come at step 30, within the first epoch" in m for m in started), started


def test_a_loss_above_the_level_counts_as_flat_too(tmp_path):
    """A run that diverged (confidently wrong) does worse than the constant prediction: the same failure."""
    assert _drive(CollapseCallback(LN2), _args(tmp_path), [4.0, 19.4, 18.3]).kind == "constant"


def test_a_healthy_run_is_not_reported(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # starts at the level (a fresh head predicts the prior) and then learns
        assert _drive(CollapseCallback(LN2), _args(tmp_path), [0.70, 0.69, 0.55, 0.41, 0.35, 0.30, 0.31, 0.28]) is None
        # flat twice, then below: the evidence must be consecutive
        assert _drive(CollapseCallback(LN2), _args(tmp_path), [0.70, 0.69, 0.60, 0.70, 0.69, 0.50]) is None
    assert _warnings(caplog) == []


def test_the_tolerance_decides_what_is_at_the_level(tmp_path):
    just_below = LN2 * (1 - 0.02) - 1e-3
    assert _drive(CollapseCallback(LN2), _args(tmp_path), [just_below] * 5) is None
    assert _drive(CollapseCallback(LN2), _args(tmp_path), [just_below + 2e-3] * 3).kind == "constant"
    assert _drive(CollapseCallback(LN2, tolerance=0.1), _args(tmp_path), [just_below] * 3).kind == "constant"


def test_patience_is_the_number_of_logged_steps(tmp_path):
    assert _drive(CollapseCallback(LN2, patience=5), _args(tmp_path), [0.7] * 4) is None
    assert _drive(CollapseCallback(LN2, patience=5), _args(tmp_path), [0.7] * 5).step == 50
    with pytest.raises(ValueError, match="at least 1"):
        CollapseCallback(LN2, patience=0)


def test_a_non_finite_loss_is_reported_after_two_logs(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _drive(CollapseCallback(LN2), _args(tmp_path), [0.6, float("nan"), 0.5, float("inf"), 0.4]) is None
        report = _drive(CollapseCallback(LN2), _args(tmp_path), [0.6, float("nan"), float("nan"), float("nan")])
    assert report.kind == "nonfinite" and report.step == 30
    [message] = _warnings(caplog)
    assert "not finite at logged steps 20, 30" in message and "--learning_rate" in message
    assert "--fp16" not in message  # the precision hint is for fp16 runs only


def test_a_nan_hidden_by_the_logging_filter_shows_in_the_gradient_norm(tmp_path):
    """With logging_nan_inf_filter (the default) a NaN run logs a finite loss (0.0); its gradient norm is NaN."""
    report = _drive(CollapseCallback(LN2), _args(tmp_path, fp16=False), [0.6, 0.0, 0.0],
                    grad_norms=[1.0, float("nan"), float("nan")])
    assert report.kind == "nonfinite" and report.step == 30


def test_the_fp16_hint(tmp_path, monkeypatch):
    args = _args(tmp_path)
    monkeypatch.setattr(args, "fp16", True, raising=False)
    report = _drive(CollapseCallback(None), args, [float("nan")] * 2)
    assert "--bf16" in report.message


def test_a_rising_loss_is_reported_without_a_constant_level(tmp_path):
    """A language model starts far below its unigram entropy: a loss climbing back above its start is the sign."""
    assert _drive(CollapseCallback(None), _args(tmp_path), [3.0, 3.3, 2.9, 3.6, 3.1, 2.8]) is None  # noise
    report = _drive(CollapseCallback(None), _args(tmp_path), [3.0, 3.1, 3.8, 4.2, 5.0, 5.5])
    assert report.kind == "rising" and report.step == 50
    assert "25% above its first logged value (3)" in report.message and "30-50" in report.message


def test_logs_during_warmup_do_not_count(tmp_path, caplog):
    args = _args(tmp_path, warmup_steps=30)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        report = _drive(CollapseCallback(LN2), args, [0.7] * 8)
    assert report.step == 60  # logs at 40, 50, 60: the first three after warm-up
    assert any("can come at step 60" in r.getMessage() for r in caplog.records)


def test_evaluation_logs_and_other_processes(tmp_path, caplog):
    callback = CollapseCallback(LN2)
    args = _args(tmp_path)
    state = T.TrainerState(max_steps=100, num_train_epochs=1, is_world_process_zero=False)
    callback.on_train_begin(args, state, T.TrainerControl())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for step in (10, 20, 30):
            state.global_step = step
            callback.on_log(args, state, T.TrainerControl(), logs={"eval_loss": float("nan")})  # not training
            callback.on_log(args, state, T.TrainerControl(), logs={"loss": 0.7})
    assert callback.report.kind == "constant" and callback.report.step == 30
    assert [r for r in caplog.records if r.name == LOGGER] == []  # only the main process logs


def test_a_first_epoch_too_short_for_the_logging_cadence_gets_logs_of_its_own(tmp_path, caplog):
    """1,000 sentences in batches of 32 (32 steps an epoch, 3 epochs), logging every 25: the regular logs would
    report at step 75, in epoch 3; the check asks for logs at steps 10, 20 and 30, so it can report at step 25."""
    callback = CollapseCallback(LN2)
    args = _args(tmp_path, logging_steps=25)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _drive(callback, args, [], max_steps=96, epochs=3)
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "at steps 10, 20, 30 for this check" in line and "step 25, within the first epoch" in line, line
    state, asked = T.TrainerState(max_steps=96, num_train_epochs=3), []
    for step in range(1, 97):
        state.global_step = step
        control = T.TrainerControl()
        callback.on_step_end(args, state, control)
        if control.should_log:
            asked.append(step)
    assert asked == [10, 20, 30]
    # a cadence that already fits in the first epoch asks for nothing
    _drive(callback, _args(tmp_path, logging_steps=5), [], max_steps=96, epochs=3)
    assert callback._extra_logs == []


def test_no_level_from_a_single_label():
    assert CollapseCallback(0.0).constant_loss is None
    assert CollapseCallback(float("nan")).constant_loss is None


# --------------------------------------------------------------------------- real runs of a tiny model


def _two_vocabularies(n=128, seed=5):
    """Rows of 12 tokens drawn from ids 3-49 (label 1) or 50-99 (label 0): every token gives the label away, so a
    tiny BERT at a sound rate learns it within an epoch."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    low, high = torch.randint(3, 50, (n, 12), generator=g), torch.randint(50, 100, (n, 12), generator=g)
    ids = torch.where(labels[:, None] == 1, low, high)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 12] * n, "labels": labels.tolist()})


def _tiny_run(tmp_path, learning_rate):
    """Full fine-tuning of a seeded 2-layer BERT for 3 epochs of 16 steps, the loss logged every 4 steps."""
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(T.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100, num_labels=2))
    data = _two_vocabularies()
    level = ConstantLoss(label_entropy(data["labels"]), "the entropy of the training labels")
    callback = CollapseCallback(level)
    args = _args(tmp_path, learning_rate=learning_rate, per_device_train_batch_size=8, num_train_epochs=3,
                 logging_steps=4, seed=0, log_level="error")
    trainer = T.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    return callback.report, [h["loss"] for h in trainer.state.log_history if "loss" in h], level.value


@pytest.mark.parametrize("learning_rate", [3e-2, 1.0])
def test_a_rate_that_collapses_a_tiny_bert_is_reported_within_the_first_epoch(tmp_path, caplog, learning_rate):
    """At 3e-2 the loss sits at the constant level for all three epochs (the collapse seen on mpnet); at 1.0 it
    diverges far above it. Either is reported at step 12 of the 16-step first epoch, once."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report, losses, level = _tiny_run(tmp_path, learning_rate)
    assert min(losses[-3:]) >= 0.98 * level, f"the run was meant to collapse: {losses}"
    assert report is not None and report.kind == "constant", losses
    assert report.step == 12
    assert len(_warnings(caplog)) == 1


def test_a_healthy_rate_on_a_tiny_bert_is_not_reported(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report, losses, level = _tiny_run(tmp_path, learning_rate=1e-2)
    assert losses[-1] < 0.1 * level, f"the healthy run must learn for this test to mean anything: {losses}"
    assert report is None, (report, losses)
    assert _warnings(caplog) == []


# --------------------------------------------------------------------------- levels and constant predictions


def test_label_entropy_is_the_loss_of_predicting_the_label_frequencies():
    assert label_entropy([0, 1] * 50) == pytest.approx(LN2)
    assert label_entropy([0, 0, 0, 1]) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert label_entropy([[-100, 3, 4, -100], [3, -100]]) == pytest.approx(label_entropy([3, 4, 3]))  # rows, -100 out
    assert label_entropy([5] * 10) == 0.0 and label_entropy([]) is None and label_entropy([[-100]]) is None
    assert label_variance([1.0, 3.0, float("nan")]) == pytest.approx(1.0) and label_variance([]) is None


def test_token_constant_loss_reads_the_labels_column():
    features = Dataset.from_dict({"input_ids": [[1, 2, 2, 3]] * 3, "labels": [[-100, 2, 2, 3]] * 3})
    level = token_constant_loss(features)
    assert level.value == pytest.approx(label_entropy([2, 2, 3])) and "tokens" in level.source
    assert token_constant_loss(features, max_rows=1).value == pytest.approx(level.value)
    assert token_constant_loss(None) is None


def test_warn_if_constant_names_the_label_and_the_majority(caplog):
    labels = np.array([0] * 30 + [1] * 10)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert warn_if_constant(np.ones(40, dtype=int), labels, "scored words", "tag", names=["NN", "DT"])
        assert not warn_if_constant(np.array([1] * 39 + [0]), labels)  # not constant
        assert not warn_if_constant(np.ones(10, dtype=int), labels[:10])  # too few to say, and one label only
    [message] = _warnings(caplog)
    assert "all 40 scored words were given the same tag (DT)" in message
    assert "scores 25.0% here (the majority tag NN scores 75.0%)" in message and "--learning_rate" in message


def test_the_callback_reads_nothing_per_step(tmp_path):
    """The check reads the losses Trainer logs: its only per-step hook compares the step number with the steps it
    asked logs for, and reads no tensor (a per-step read of the loss would be a host sync on a GPU)."""
    from bitfit_hf.training.async_step import HostReads

    for hook in ("on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step"):
        assert getattr(CollapseCallback, hook) is getattr(T.TrainerCallback, hook), hook
    callback = CollapseCallback(LN2)
    args = _args(tmp_path, logging_steps=25)
    _drive(callback, args, [], max_steps=96, epochs=3)
    state = T.TrainerState(max_steps=96, num_train_epochs=3)
    with HostReads() as reads:
        for step in range(1, 97):
            state.global_step = step
            callback.on_step_end(args, state, T.TrainerControl())
    assert reads.count == 0
