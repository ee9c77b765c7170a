"""The training step the host never waits on (bitfit_hf/training/async_step.py): a BitFitTrainer step reads no
device value (the stock Trainer reads one, so the check can fail), and trains, logs and counts exactly what the
stock Trainer does over the same trainable tensors; non-finite losses are logged as Trainer logs them."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as T

from bitfit_hf import BitFitConfig, BitFitTrainer
from bitfit_hf.training.async_step import (
    FlopCounter,
    HostReads,
    finite_or_running_mean,
    trained_parameters,
    use_non_blocking_copies,
)


def _model(seed: int = 0):
    torch.manual_seed(seed)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return T.BertForSequenceClassification(config)


class _Data(torch.utils.data.Dataset):
    """Full-length batches. ``mask=False`` leaves the attention mask out, as a plain loop over unpadded batches
    does: with one, transformers' SDPA mask code reads ``mask.all()`` once per eager forward (traced away under
    torch.compile), a read of the model's, not of the training loop's."""

    def __init__(self, n: int = 64, length: int = 8, mask: bool = True):
        self.mask = mask
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, length), generator=generator)
        self.labels = torch.randint(0, 2, (n,), generator=generator)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        item = {"input_ids": self.ids[i], "labels": self.labels[i]}
        return {**item, "attention_mask": torch.ones_like(self.ids[i])} if self.mask else item


def _args(tmp_path, **overrides) -> T.TrainingArguments:
    options = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=6, learning_rate=1e-2,
                   weight_decay=0.0, optim="adamw_torch", logging_steps=1, report_to=[], save_strategy="no",
                   use_cpu=True, disable_tqdm=True, seed=0, dataloader_drop_last=True, max_grad_norm=0.5)
    options.update(overrides)
    return T.TrainingArguments(**options)


class _ReadsPerStep(T.TrainerCallback):
    """Host reads of tensor values from each step's beginning to its end (training_step, the loop's checks,
    clipping, the schedule), the optimizer's step left out: on the CPU AdamW reads its step counters (CPU tensors
    on a GPU too), and the fused AdamW a GPU run uses reads nothing."""

    def __init__(self):
        self.per_step, self._mode, self._names = [], None, []

    def _open(self):
        self._mode = HostReads()
        self._mode.__enter__()

    def _close(self):
        self._mode.__exit__(None, None, None)
        self._names += self._mode.names

    def on_step_begin(self, args, state, control, **kwargs):
        self._names = []
        self._open()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._close()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._open()

    def on_step_end(self, args, state, control, **kwargs):
        self._close()
        self.per_step.append(self._names)


def _bitfit_trainable(model) -> None:
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith("bias") or name.startswith("classifier"))


def _run(kind: str, tmp_path, callbacks=(), compute_loss=None, data=None, **overrides):
    model = _model()
    args = _args(tmp_path, **overrides)
    if kind == "trainer":
        _bitfit_trainable(model)
        cls = T.Trainer
    else:
        cls = BitFitTrainer
    if compute_loss is not None:
        cls = type(f"Patched{cls.__name__}", (cls,), {"compute_loss": compute_loss})
    kwargs = {} if kind == "trainer" else {"method_config": BitFitConfig(bias_terms="all")}
    trainer = cls(model=model, args=args, train_dataset=data or _Data(), callbacks=list(callbacks), **kwargs)
    trainer.train()
    return trainer


def test_a_bitfit_step_reads_nothing_back_from_the_device(tmp_path):
    reads = {}
    for kind in ("trainer", "bitfit"):
        counter = _ReadsPerStep()
        _run(kind, tmp_path / kind, callbacks=[counter], data=_Data(mask=False), logging_steps=100)
        reads[kind] = counter.per_step
    assert len(reads["bitfit"]) == 6
    assert all(step == [] for step in reads["bitfit"]), reads["bitfit"]
    # the stock loop's non-finite check reads the loss every step: what this test exists to catch
    assert all("__bool__" in step for step in reads["trainer"]), reads["trainer"]


def test_bitfit_trains_logs_and_counts_exactly_as_the_trainer(tmp_path):
    trainers = {kind: _run(kind, tmp_path / kind) for kind in ("trainer", "bitfit")}
    params = {kind: dict(t.model.named_parameters()) for kind, t in trainers.items()}
    for name, param in params["trainer"].items():
        assert torch.equal(param, params["bitfit"][name]), name
    logs = {kind: [e for e in t.state.log_history if "loss" in e] for kind, t in trainers.items()}
    assert len(logs["bitfit"]) == 6
    for ours, stock in zip(logs["bitfit"], logs["trainer"]):
        assert ours["loss"] == stock["loss"] and ours["grad_norm"] == stock["grad_norm"]
    assert trainers["bitfit"].state.total_flos == trainers["trainer"].state.total_flos > 0


def test_a_non_finite_loss_is_logged_as_the_trainer_logs_it(tmp_path):
    def nan_at_step_3(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super(type(self), self).compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step == 3:  # a constant: the gradients stay finite, only the logged loss is NaN
            loss = loss + torch.tensor(float("nan"))
        return loss

    losses = {}
    for kind in ("trainer", "bitfit"):
        trainer = _run(kind, tmp_path / kind, compute_loss=nan_at_step_3, logging_steps=2)
        losses[kind] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        assert trainer.args.logging_nan_inf_filter is True  # the user's choice is back after training
    assert all(math.isfinite(v) for v in losses["bitfit"])
    assert losses["bitfit"] == losses["trainer"]


def test_the_filter_follows_the_users_choice(tmp_path):
    def nan_at_step_3(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super(type(self), self).compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss + torch.tensor(float("nan")) if self.state.global_step == 3 else loss

    logged = {}
    for kind in ("trainer", "bitfit"):
        trainer = _run(kind, tmp_path / kind, compute_loss=nan_at_step_3, logging_steps=1, logging_nan_inf_filter=False)
        logged[kind] = [repr(e["loss"]) for e in trainer.state.log_history if "loss" in e]
    assert logged["bitfit"][3] == "nan"  # unfiltered, as asked (Trainer's running sum stays NaN from there on)
    assert logged["bitfit"] == logged["trainer"]


def test_finite_or_running_mean():
    running = torch.tensor(3.0)  # three steps since the last log, summing to 3
    assert finite_or_running_mean(torch.tensor(0.5), running, 2).item() == 0.5
    assert finite_or_running_mean(torch.tensor(float("inf")), running, 2).item() == 1.0
    assert finite_or_running_mean(torch.tensor(float("nan")), None, 0).item() == 0.0


def test_flop_counter_counts_parameters_once():
    model = _model()
    counter = FlopCounter()
    inputs = {"input_ids": torch.zeros(4, 8, dtype=torch.long)}
    expected = 6 * 32 * model.num_parameters(exclude_embeddings=True)
    assert counter(model, inputs) == expected
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model, "num_parameters", lambda **_: pytest.fail("counted again"))
        assert counter(model, inputs) == expected
    assert counter(model, {"pixel_values": torch.zeros(1)}) == 0


def test_trained_parameters_and_copies_on_the_cpu(tmp_path):
    model = _model()
    _bitfit_trainable(model)
    assert trained_parameters(model) == [p for p in model.parameters() if p.requires_grad]
    args = _args(tmp_path)
    assert use_non_blocking_copies(args) is False  # no CUDA device: nothing to overlap
    assert args.accelerator_config.non_blocking is False


def test_only_the_training_batches_drop_their_last_partial_batch(tmp_path):
    """The fast path's one shape per step: training batches are all full; evaluation still sees every example."""
    model = _model()
    args = _args(tmp_path, per_device_train_batch_size=24, per_device_eval_batch_size=24, dataloader_drop_last=False)
    trainer = BitFitTrainer(model=model, args=args, train_dataset=_Data(n=50), eval_dataset=_Data(n=50),
                            drop_last_train_batch=True)
    assert [len(b["labels"]) for b in trainer.get_train_dataloader()] == [24, 24]
    assert [len(b["labels"]) for b in trainer.get_eval_dataloader()] == [24, 24, 2]
    assert trainer.predict(_Data(n=50)).predictions.shape[0] == 50
    assert args.dataloader_drop_last is False
    default = BitFitTrainer(model=_model(), args=_args(tmp_path, dataloader_drop_last=False), train_dataset=_Data(n=50))
    assert sum(len(b["labels"]) for b in default.get_train_dataloader()) == 50


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_a_window_of_only_non_finite_losses_is_logged_as_nan(tmp_path, max_grad_norm):
    """The filter substitutes the window's running mean, which is 0.0 when the whole window is non-finite: logged
    as 0.0 the collapse would show only through the gradient norm, absent with max_grad_norm=0."""
    def nan_in_the_second_window(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super(type(self), self).compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step in (2, 3):  # a constant: the gradients stay finite, only the losses are NaN
            loss = loss + torch.tensor(float("nan"))
        return loss

    logged = {}
    for kind in ("trainer", "bitfit"):
        trainer = _run(kind, tmp_path / kind, compute_loss=nan_in_the_second_window, logging_steps=2,
                       max_grad_norm=max_grad_norm)
        logged[kind] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert logged["trainer"][1] == 0.0  # the stock filter's figure for that window
    first, second, third = logged["bitfit"]
    assert math.isfinite(first) and math.isnan(second) and math.isfinite(third)
    assert first == logged["trainer"][0] and third == logged["trainer"][2]


class _LoopWithBoth:
    def _inner_training_loop(self):
        self._tr_loss, self._globalstep_last_logged = 0, 0


class _LoopWithoutStepCounter:
    def _inner_training_loop(self):
        self._tr_loss = 0


class _LoopWithoutRunningLoss:
    def _inner_training_loop(self):
        self._globalstep_last_logged = 0


def test_the_on_device_filter_needs_both_trainer_attributes():
    from bitfit_hf.training.trainer import keeps_running_loss

    assert keeps_running_loss(T.Trainer)  # this transformers keeps both
    assert keeps_running_loss(_LoopWithBoth)
    assert not keeps_running_loss(_LoopWithoutStepCounter)  # renamed: the Trainer keeps its own filter
    assert not keeps_running_loss(_LoopWithoutRunningLoss)
