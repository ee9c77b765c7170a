"""BitFitTrainer on the real all-MiniLM-L6-v2: only the selection moves, everything else is bit-identical."""

from __future__ import annotations

import logging
import os

import pytest
import torch
import transformers as T
from datasets import Dataset

from bitfit_hf import BitFitConfig, BitFitTrainer
from bitfit_hf.training.trainer import loss_uses_num_items

SENTENCES = [
    ("a gorgeous, witty, seductive movie.", 1), ("the plot is nothing but boilerplate clichés.", 0),
    ("an utterly charming and hilarious film.", 1), ("it's a mess, tedious and overlong.", 0),
    ("one of the most moving films of the year.", 1), ("dull, lifeless and badly acted.", 0),
    ("a triumph of smart, funny filmmaking.", 1), ("the jokes fall flat every single time.", 0),
] * 4


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return T.AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def dataset(tokenizer):
    enc = tokenizer([s for s, _ in SENTENCES], padding="max_length", max_length=24, truncation=True)
    return Dataset.from_dict({**enc, "labels": [label for _, label in SENTENCES]})


def load_minilm(minilm_dir, num_labels=2):
    torch.manual_seed(0)  # the classifier head is freshly initialised
    return T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=num_labels)


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_train_epochs=1, learning_rate=1e-2,
                report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0)
    base.update(kw)
    return T.TrainingArguments(**base)


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("preset", ["all", "paper-subset"])
def test_unselected_parameters_are_bit_identical_after_training(minilm_dir, dataset, tmp_path, preset):
    model = load_minilm(minilm_dir)
    before = snapshot(model)
    trainer = BitFitTrainer(model, args(tmp_path), train_dataset=dataset, method_config=BitFitConfig(preset))
    trainer.train()
    selected = set(trainer.tuner_state.selection.parameter_names)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved <= selected  # nothing outside the selection changed, bit for bit
    assert len(moved) >= 0.9 * len(selected)  # and the selection really trained
    if preset == "paper-subset":
        assert all(n.endswith(("query.bias", "intermediate.dense.bias")) or n.startswith("classifier.") for n in selected)
        assert len(selected) == 6 + 6 + 2


def test_optimizer_groups_learning_rates_and_weight_decay(minilm_dir, dataset, tmp_path):
    model = load_minilm(minilm_dir)
    cfg = BitFitConfig("all", bias_learning_rate=1e-3, head_learning_rate=5e-3)
    trainer = BitFitTrainer(model, args(tmp_path, weight_decay=0.01), train_dataset=dataset, method_config=cfg)
    optimizer = trainer.create_optimizer()
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {(g["lr"], g["weight_decay"]): sorted(names[id(p)] for p in g["params"]) for g in optimizer.param_groups}
    assert set(groups) == {(1e-3, 0.0), (5e-3, 0.01), (5e-3, 0.0)}
    assert all(n.endswith(".bias") and not n.startswith("classifier") for n in groups[(1e-3, 0.0)])
    assert groups[(5e-3, 0.01)] == ["classifier.weight"] and groups[(5e-3, 0.0)] == ["classifier.bias"]
    in_optimizer = {n for ns in groups.values() for n in ns}
    assert in_optimizer == {n for n, p in model.named_parameters() if p.requires_grad}
    # MiniLM's 50 bias tensors but the untrained pooler's (the trainer classifies from the checkpoint's mean
    # pooling and removes the pooler), and the classifier
    assert len(in_optimizer) == 49 + 2
    assert not any(".pooler." in n for n, _ in model.named_parameters())


@pytest.mark.parametrize("optim", ["adamw_torch", "sgd", "adafactor", "rmsprop"])
def test_works_with_trainer_optimizers(minilm_dir, dataset, tmp_path, optim):
    model = load_minilm(minilm_dir)
    before = snapshot(model)
    trainer = BitFitTrainer(model, args(tmp_path, optim=optim, max_steps=2), train_dataset=dataset)
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n.endswith("query.bias"))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n.endswith(".weight") and "classifier" not in n)


def test_refuses_to_train_nothing(minilm_dir, tmp_path):
    with pytest.raises(ValueError, match="selects nothing"):
        BitFitTrainer(load_minilm(minilm_dir), args(tmp_path), method_config=BitFitConfig("frozen", train_head=False))


def test_summary_logged_once_at_start(minilm_dir, dataset, tmp_path, caplog):
    trainer = BitFitTrainer(load_minilm(minilm_dir), args(tmp_path, max_steps=1), train_dataset=dataset)
    with caplog.at_level(logging.INFO, logger="bitfit_hf"):
        trainer.train()
        trainer.train()
    assert sum("Trainable parameters (bitfit)" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("reentrant", [None, True])
def test_gradient_checkpointing_with_frozen_embeddings_matches_plain_run(minilm_dir, dataset, tmp_path, reentrant):
    """Reentrant checkpoints with frozen embeddings would silently skip every bias inside a layer."""
    results = []
    for checkpointing in (False, True):
        model = load_minilm(minilm_dir)
        extra = {"activation_checkpointing": checkpointing}
        if checkpointing and reentrant is not None:
            extra["activation_checkpointing_kwargs"] = {"use_reentrant": reentrant}
        trainer = BitFitTrainer(model, args(tmp_path, max_steps=3, **extra), train_dataset=dataset)
        trainer.train()
        results.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    plain, checkpointed = results
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=1e-6)
    assert not torch.equal(checkpointed["bert.encoder.layer.0.attention.self.query.bias"],
                           load_minilm(minilm_dir).bert.encoder.layer[0].attention.self.query.bias)


def test_bf16_mixed_precision_on_cpu(minilm_dir, dataset, tmp_path):
    model = load_minilm(minilm_dir)
    before = snapshot(model)
    trainer = BitFitTrainer(model, args(tmp_path, bf16=True, max_steps=3), train_dataset=dataset)
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and moved <= set(trainer.tuner_state.selection.parameter_names)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_checkpoints_hold_the_adapter_and_resume_exactly(minilm_dir, dataset, tmp_path):
    straight = load_minilm(minilm_dir)
    BitFitTrainer(straight, args(tmp_path / "a", max_steps=6), train_dataset=dataset).train()

    first = load_minilm(minilm_dir)
    run = args(tmp_path / "b", max_steps=6, save_strategy="steps", save_steps=3)
    BitFitTrainer(first, run, train_dataset=dataset).train()
    checkpoint = os.path.join(run.output_dir, "checkpoint-3")
    files = set(os.listdir(checkpoint))
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= files
    assert "model.safetensors" not in files  # no full copy of the model per checkpoint

    resumed = load_minilm(minilm_dir)
    BitFitTrainer(resumed, run, train_dataset=dataset).train(resume_from_checkpoint=checkpoint)
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=name)


def test_save_model_writes_adapter_or_full_model(minilm_dir, dataset, tmp_path, tokenizer):
    trainer = BitFitTrainer(load_minilm(minilm_dir), args(tmp_path), train_dataset=dataset, processing_class=tokenizer)
    trainer.save_model(str(tmp_path / "adapter"))
    files = set(os.listdir(tmp_path / "adapter"))
    assert {"adapter_model.safetensors", "adapter_config.json", "trainable_summary.json"} <= files
    assert "model.safetensors" not in files and "training_args.bin" not in files
    assert os.path.getsize(tmp_path / "adapter" / "adapter_model.safetensors") < 200_000

    full = BitFitTrainer(load_minilm(minilm_dir), args(tmp_path), train_dataset=dataset,
                         method_config=BitFitConfig("all", save_full_model=True))
    full.save_model(str(tmp_path / "full"))
    assert "model.safetensors" in os.listdir(tmp_path / "full")


def test_full_model_checkpoints_record_the_users_training_arguments(minilm_dir, dataset, tmp_path):
    """The fields BitFitTrainer sets aside while it trains (the loss filter, the checkpoint limit) are pickled in each
    checkpoint's training_args.bin with the user's values, and are the user's again after training."""
    trainer = BitFitTrainer(load_minilm(minilm_dir), args(tmp_path, save_strategy="steps", save_steps=2, max_steps=2,
                                                          save_total_limit=3, logging_nan_inf_filter=True),
                            train_dataset=dataset, method_config=BitFitConfig("all", save_full_model=True))
    trainer.train()
    saved = torch.load(tmp_path / "out" / "checkpoint-2" / "training_args.bin", weights_only=False)  # written here
    assert (saved.save_total_limit, saved.logging_nan_inf_filter) == (3, True)
    assert (trainer.args.save_total_limit, trainer.args.logging_nan_inf_filter) == (3, True)
    assert not [name for name in os.listdir(tmp_path / "out" / "checkpoint-2") if name.endswith(".partial")]


def test_loss_scaling_detection():
    tiny = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    assert not loss_uses_num_items(T.BertForSequenceClassification(T.BertConfig(**tiny)))
    assert not loss_uses_num_items(T.BertForTokenClassification(T.BertConfig(**tiny)))
    assert loss_uses_num_items(T.LlamaForCausalLM(T.LlamaConfig(**tiny, num_key_value_heads=1)))
