"""The converged linear probe: for every head kind the recipes build, the fitted head sits at a minimum of its
objective on the cache, the encoder is untouched, and the trainer's head start uses it."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bitfit_hf.training.probe import (
    ProbeError,
    collect_head_inputs,
    head_kind,
    probe_head,
    probe_layer,
    probe_objective,
)

torch.set_num_threads(2)


def _bert_config(**kwargs):
    return T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=120, max_position_embeddings=64, **kwargs)


def _batches(kind: str, n_batches: int = 3, size: int = 8, length: int = 10, num_labels: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(5, 120, (size, length), generator=g)
        mask = torch.ones(size, length, dtype=torch.long)
        mask[: size // 2, length - 3:] = 0  # some padding
        batch = {"input_ids": ids, "attention_mask": mask}
        if kind == "sequence":
            batch["labels"] = (ids[:, 1] % num_labels)  # learnable from the tokens
        elif kind == "regression":
            batch["labels"] = (ids[:, 1].float() / 120.0)
        elif kind == "token":
            labels = ids % num_labels
            labels[mask == 0] = -100
            labels[:, 0] = -100  # [CLS]-like positions unlabelled
            batch["labels"] = labels
        else:
            start = torch.randint(0, length - 4, (size,), generator=g)
            batch["start_positions"], batch["end_positions"] = start, start + 2
        out.append(batch)
    return out


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "sequence":
        return T.BertForSequenceClassification(_bert_config(num_labels=3)).eval()
    if kind == "regression":
        return T.BertForSequenceClassification(_bert_config(num_labels=1)).eval()
    if kind == "token":
        return T.BertForTokenClassification(_bert_config(num_labels=3)).eval()
    return T.BertForQuestionAnswering(_bert_config()).eval()


def _head(model):
    for name in ("classifier", "qa_outputs"):
        if hasattr(model, name):
            return getattr(model, name)
    raise AssertionError("no head")


@pytest.mark.parametrize("kind", ["sequence", "regression", "token", "qa"])
def test_the_fitted_head_is_at_a_minimum_of_its_objective_and_the_encoder_is_untouched(kind):
    model = _model(kind)
    encoder = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith(("classifier", "qa_outputs"))}
    batches = _batches(kind)
    result = probe_head(model, batches, l2=1e-2)
    assert result.loss_after < result.loss_before
    head = _head(model)
    cache = collect_head_inputs(model, batches)
    objective = probe_objective(head, cache, 1e-2)
    loss = objective()
    grads = torch.autograd.grad(loss, list(head.parameters()))
    assert max(float(g.abs().max()) for g in grads) < 5e-4  # stationary (to float32 precision): the gradient vanishes
    with torch.no_grad():  # and a minimum: every small step away raises the objective
        for direction in range(4):
            g = torch.Generator().manual_seed(direction)
            steps = [1e-2 * torch.randn(p.shape, generator=g) for p in head.parameters()]
            for p, s in zip(head.parameters(), steps):
                p.add_(s)
            assert float(objective()) > float(loss)
            for p, s in zip(head.parameters(), steps):
                p.sub_(s)
    for name, param in model.named_parameters():
        if name in encoder:
            assert torch.equal(param, encoder[name]), name  # bit-identical
    assert result.kind == ("sequence" if kind == "regression" else kind)


def test_the_probe_reproduces_a_closed_form_ridge_regression():
    """A regression head is linear least squares: the probe must land on the normal equations' answer."""
    model = _model("regression")
    batches = _batches("regression")
    l2 = 1e-2
    probe_head(model, batches, l2=l2)
    cache = collect_head_inputs(model, batches)
    x = torch.cat([c.reshape(-1, c.size(-1)) for c in cache.inputs]).double()
    y = torch.cat([t["labels"] for t in cache.targets]).double()
    n, d = x.shape
    design = torch.cat([x, torch.ones(n, 1, dtype=torch.double)], dim=1)
    # mean squared error + l2/2 ||w||^2 (the bias unpenalised): (X'X/n + l2/2 * 2/2 * D) b = X'y/n with D = diag(1..1, 0)
    penalty = torch.diag(torch.cat([torch.full((d,), l2 / 2, dtype=torch.double), torch.zeros(1, dtype=torch.double)]))
    solution = torch.linalg.solve(2 * design.T @ design / n + 2 * penalty, 2 * design.T @ y / n)
    head = model.classifier
    assert torch.allclose(head.weight.double().flatten(), solution[:d], atol=1e-3)
    assert torch.allclose(head.bias.double(), solution[d:], atol=1e-3)


def test_a_head_with_a_hidden_layer_has_only_its_output_layer_fitted():
    """RoBERTa's and MPNet's heads are dense + tanh + out_proj: the probe stays linear (fitting the whole head
    overfits a small training set), so out_proj is fitted on what it reads and dense keeps its initial values."""
    torch.manual_seed(0)
    config = T.RobertaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             vocab_size=120, max_position_embeddings=64, num_labels=3)
    model = T.RobertaForSequenceClassification(config).eval()
    dense = {n: p.detach().clone() for n, p in model.classifier.dense.named_parameters()}
    batches = _batches("sequence")
    assert probe_layer(model) == ("classifier.out_proj", model.classifier.out_proj)
    cache = collect_head_inputs(model, batches)
    assert cache.inputs[0].shape == (8, 32)  # out_proj's input: the first token through dense + tanh
    result = probe_head(model, batches, l2=1e-2)
    assert result.head == "classifier.out_proj" and result.loss_after < result.loss_before
    for name, param in model.classifier.dense.named_parameters():
        assert torch.equal(param, dense[name]), name
    layer = model.classifier.out_proj
    grads = torch.autograd.grad(probe_objective(layer, cache, 1e-2)(), list(layer.parameters()))
    assert max(float(g.abs().max()) for g in grads) < 5e-4  # out_proj at the stationary point of its objective


def test_a_head_that_changes_its_output_layers_answer_is_refused():
    torch.manual_seed(0)
    model = _model("sequence")
    model.classifier = torch.nn.Sequential(torch.nn.Linear(32, 3), torch.nn.Tanh())
    with pytest.raises(ProbeError, match="transforms its last linear layer's output"):
        probe_head(model, _batches("sequence"))


def test_heads_the_probe_cannot_fit_are_refused_with_the_way_out():
    model = T.BertForMaskedLM(_bert_config())
    with pytest.raises(ProbeError, match="without --probe_head_start"):
        head_kind(model)
    torch.manual_seed(0)
    distil = T.DistilBertForSequenceClassification(T.DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                                                                      vocab_size=120, num_labels=2))
    with pytest.raises(ProbeError, match="2 .*pre_classifier, classifier"):
        probe_head(distil, _batches("sequence", num_labels=2))


def test_batches_without_targets_are_an_error():
    model = _model("sequence")
    batches = [{k: v for k, v in b.items() if k != "labels"} for b in _batches("sequence")]
    with pytest.raises(ProbeError, match="no labels"):
        probe_head(model, batches)


def test_the_cache_stops_at_its_size_limit_and_the_fit_still_runs(caplog):
    model = _model("qa")
    batches = _batches("qa", n_batches=4)
    one_batch = 8 * 10 * 32 * 4  # examples x positions x hidden x float32 bytes
    cache = collect_head_inputs(model, batches, max_cache_bytes=2 * one_batch)
    assert cache.truncated and len(cache.inputs) == 2
    result = probe_head(model, batches, max_cache_bytes=2 * one_batch)
    assert result.examples == 16 and result.loss_after < result.loss_before
    assert "fitted on the first 16 cached examples" in caplog.text


def _trainer(model, tmp_path, **kwargs):
    from transformers import TrainingArguments

    from bitfit_hf import BitFitTrainer

    rows = [{k: v[i] for k, v in b.items()} for b in _batches("sequence", num_labels=2) for i in range(8)]
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=8, report_to=[], use_cpu=True,
                             save_strategy="no")
    return BitFitTrainer(model, args, train_dataset=rows, **kwargs)


def test_the_trainer_fits_the_probe_before_the_first_step(tmp_path):
    model = T.BertForSequenceClassification(_bert_config(num_labels=2))
    trainer = _trainer(model, tmp_path, probe_head_start=True)
    output = trainer.train()
    assert trainer.probe_result is not None and output.metrics["probe_examples"] == 24
    assert trainer.state.log_history[0]["probe_loss"] == trainer.probe_result.loss_after


def test_a_head_the_probe_cannot_fit_trains_as_without_it(tmp_path, caplog):
    torch.manual_seed(0)
    distil = T.DistilBertForSequenceClassification(T.DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                                                                      vocab_size=120, num_labels=2))
    trainer = _trainer(distil, tmp_path, probe_head_start=True)
    assert trainer.train().global_step == 2 and trainer.probe_result is None
    assert "Probe head start skipped" in caplog.text


def test_a_method_with_frozen_biases_still_trains_after_the_probe(tmp_path):
    """LoRA keeps every bias frozen, yet trains its matrices: only a head-only selection stops at the probe."""
    from bitfit_hf import BitFitConfig, BitFitLoraConfig

    lora = _trainer(T.BertForSequenceClassification(_bert_config(num_labels=2)), tmp_path / "lora",
                    probe_head_start=True, method_config=BitFitLoraConfig(lora_r=2, bias_terms="frozen"))
    assert lora.train().global_step == 2 and lora.probe_result is not None
    frozen = _trainer(T.BertForSequenceClassification(_bert_config(num_labels=2)), tmp_path / "frozen",
                      probe_head_start=True, method_config=BitFitConfig(bias_terms="frozen"))
    assert frozen.train().global_step == 0 and frozen.probe_result is not None


@pytest.mark.parametrize("kind", ["sequence", "regression", "token", "qa"])
def test_the_probe_run_saves_an_adapter_that_reproduces_its_logits_on_a_fresh_base(kind, tmp_path):
    """The frozen method's whole training is the probe: its saved adapter (the fitted head) on a fresh copy of the
    base gives the trained model's logits exactly, for every head kind."""
    from transformers import TrainingArguments

    from bitfit_hf import BitFitConfig, BitFitTrainer, load_adapter

    base = _model(kind)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    rows = [{k: v[i] for k, v in b.items()} for b in _batches(kind, num_labels=3 if kind != "regression" else 1)
            for i in range(8)]
    args = TrainingArguments(str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=8, report_to=[],
                             use_cpu=True, save_strategy="no")
    trainer = BitFitTrainer(base, args, train_dataset=rows, probe_head_start=True,
                            method_config=BitFitConfig(bias_terms="frozen"))
    assert trainer.train().global_step == 0 and trainer.probe_result is not None
    trainer.save_model(str(tmp_path / "adapter"))

    fresh = _model(kind)
    fresh.load_state_dict(base_state)
    assert not torch.equal(_head(fresh).weight, _head(trainer.model).weight)  # the head did move
    load_adapter(fresh, str(tmp_path / "adapter"), check_base=False)
    batch = {k: v for k, v in _batches(kind, n_batches=1, seed=7)[0].items() if k in ("input_ids", "attention_mask")}
    trained = trainer.model.eval()
    with torch.no_grad():
        want, got = trained(**batch), fresh.eval()(**batch)
    names = ("start_logits", "end_logits") if kind == "qa" else ("logits",)
    for name in names:
        assert torch.equal(getattr(want, name), getattr(got, name))
