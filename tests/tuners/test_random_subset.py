"""The paper's random baselines: exact counts, seeded draws, whole lines for row/col, masks that keep every
other entry bit-identical under AdamW with weight decay, and compact adapters that reproduce the logits."""

from __future__ import annotations

import os

import pytest
import torch
import transformers as T
from conftest import batch, tiny_model

from bitfit_hf import BitFitAdapter, BitFitConfig, BitFitTrainer, resolve
from bitfit_hf.adapters.bank import AdapterBank
from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.adapters.multitask import MultiTaskModel
from bitfit_hf.adapters.sparse import INDICES_SUFFIX, VALUES_SUFFIX
from bitfit_hf.cli.info_cmd import describe
from bitfit_hf.tuners import apply_method, config_from_dict
from bitfit_hf.tuners.random_subset import RandRowColConfig, RandUniformConfig
from bitfit_hf.tuners.random_subset import model as random_model
from bitfit_hf.utils.constants import WEIGHTS_NAME

ARCHS = ["bert", "roberta", "gpt2", "llama"]
CONFIGS = [RandUniformConfig, RandRowColConfig]


def extra(arch):
    return {"add_missing_biases": True} if arch == "llama" else {}  # LLaMA: the biases BitFit would add


def reference(model, arch, terms="all"):
    return resolve(model, BitFitConfig(terms, train_head=False, **extra(arch))).trainable_numel


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("config_class", CONFIGS)
def test_trainable_count_equals_the_reference_exactly(arch, config_class):
    model = tiny_model(arch)
    expected = reference(model, arch)
    state = apply_method(model, config_class(random_seed=1, **extra(arch)))
    drawn = sum(indices.numel() for indices in state.sparse_indices.values())
    assert drawn == state.summary.bias_params == expected
    for name, indices in state.sparse_indices.items():  # distinct, sorted, inside the tensor
        assert torch.equal(indices, torch.unique(indices))
        assert 0 <= int(indices.min()) and int(indices.max()) < dict(model.named_parameters())[name].numel()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    head = {n for n in trainable if n.startswith(("classifier", "score"))}
    assert trainable == set(state.sparse_indices) | head and head
    assert all(p.dim() >= 2 for n, p in model.named_parameters() if n in state.sparse_indices)
    assert not any("embed" in n or n.endswith(("wte.weight", "wpe.weight")) for n in state.sparse_indices)


@pytest.mark.parametrize("config_class", CONFIGS)
def test_match_bias_terms_picks_the_reference(config_class):
    model = tiny_model("bert")
    state = apply_method(model, config_class(bias_terms="paper-subset"))
    assert state.summary.bias_params == reference(model, "bert", "paper-subset") < reference(model, "bert")


@pytest.mark.parametrize("config_class", CONFIGS)
def test_same_seed_same_indices_other_seed_other_indices(config_class):
    first = apply_method(tiny_model("bert"), config_class(random_seed=7)).sparse_indices
    again = apply_method(tiny_model("bert", seed=5), config_class(random_seed=7)).sparse_indices  # other weights
    other = apply_method(tiny_model("bert"), config_class(random_seed=8)).sparse_indices
    assert first.keys() == again.keys() and all(torch.equal(first[n], again[n]) for n in first)
    assert first.keys() != other.keys() or any(not torch.equal(first[n], other[n]) for n in first)


def test_row_col_draws_whole_lines_and_cuts_only_the_last():
    model = tiny_model("bert")
    state = apply_method(model, RandRowColConfig(random_seed=3))
    params = dict(model.named_parameters())
    partial_lines = 0
    for name, indices in state.sparse_indices.items():
        rows, cols = params[name].shape
        mask = torch.zeros(rows * cols, dtype=torch.bool)
        mask[indices] = True
        mask = mask.view(rows, cols)
        covered = torch.zeros_like(mask)
        covered[mask.all(dim=1)] = True
        covered[:, mask.all(dim=0)] = True
        rest = mask & ~covered  # entries that no full line explains: one cut line at most
        if rest.any():
            where = rest.nonzero()
            assert len(set(where[:, 0].tolist())) == 1 or len(set(where[:, 1].tolist())) == 1
            partial_lines += 1
    assert partial_lines <= 1


def test_uniform_spreads_over_the_matrices_in_proportion():
    model = tiny_model("bert")
    state = apply_method(model, RandUniformConfig(random_seed=0))
    params = dict(model.named_parameters())
    query = "bert.encoder.layer.0.attention.self.query.weight"  # 32 x 32 of ~26k candidate entries
    dense = "bert.encoder.layer.0.intermediate.dense.weight"  # 64 x 32: twice as large
    assert state.sparse_indices[dense].numel() > state.sparse_indices[query].numel() > 0
    assert params[dense].numel() == 2 * params[query].numel()


def _dataset(vocab, n=16, length=10):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(length, dtype=torch.long), "labels": int(ids[i, 1] % 3)}
            for i in range(n)]


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=4, learning_rate=5e-2,
                weight_decay=0.1, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0,
                optim="adamw_torch")
    base.update(kw)
    return T.TrainingArguments(**base)


def _changed_entries(model, before):
    """{name: flat indices of entries that changed} over every parameter."""
    out = {}
    for name, param in model.named_parameters():
        diff = (param.detach() != before[name]).reshape(-1).nonzero().flatten()
        if diff.numel():
            out[name] = diff
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("config_class", CONFIGS)
def test_only_the_drawn_entries_move_under_adamw_with_weight_decay(arch, config_class, tmp_path):
    model = tiny_model(arch).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = BitFitTrainer(model, _args(tmp_path), train_dataset=_dataset(model.config.vocab_size),
                            method_config=config_class(random_seed=2, **extra(arch)))
    trainer.train()
    state = trainer.tuner_state
    changed = _changed_entries(model, before)
    head = {n for n in changed if n.startswith(("classifier", "score"))}
    assert head, "the head did not train"
    weights = {n: idx for n, idx in changed.items() if n not in head}
    assert set(weights) <= set(state.sparse_indices)
    moved = 0
    for name, idx in weights.items():
        allowed = set(state.sparse_indices[name].tolist())
        assert set(idx.tolist()) <= allowed, f"{name}: entries outside the draw moved"
        moved += idx.numel()
    assert moved >= 0.5 * state.reference_count  # and the drawn entries really trained


def test_step_guard_keeps_entries_even_with_a_users_decaying_optimizer(tmp_path):
    """A user's optimizer puts weight decay on everything; the guard still restores every untrained entry."""
    model = tiny_model("bert").train()
    apply_method(model, RandUniformConfig(random_seed=0))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2, weight_decay=0.5)
    trainer = BitFitTrainer(model, _args(tmp_path), train_dataset=_dataset(100), optimizers=(optimizer, None))
    trainer.train()
    for name, idx in _changed_entries(model, before).items():
        if name in trainer.tuner_state.sparse_indices:
            assert set(idx.tolist()) <= set(trainer.tuner_state.sparse_indices[name].tolist())


def test_without_the_guard_weight_decay_would_move_masked_entries():
    """Why the guard exists: gradient masks alone do not stop decoupled weight decay."""
    model = tiny_model("bert").train()
    state = apply_method(model, RandUniformConfig(random_seed=0))
    name = next(iter(state.sparse_indices))
    param = dict(model.named_parameters())[name]
    before = param.detach().clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2, weight_decay=0.5)
    model(**batch(), labels=torch.tensor([0, 1, 2, 0])).loss.backward()
    optimizer.step()
    changed = (param.detach() != before).reshape(-1).nonzero().flatten()
    assert not set(changed.tolist()) <= set(state.sparse_indices[name].tolist())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("config_class", CONFIGS)
def test_adapter_holds_only_the_entries_and_reproduces_logits(arch, config_class, tmp_path):
    model = tiny_model(arch)
    state = apply_method(model, config_class(random_seed=4, **extra(arch)))
    with torch.no_grad():  # stand-in for training: new values at the drawn entries and in the head
        params = dict(model.named_parameters())
        for name, indices in state.sparse_indices.items():
            params[name].view(-1)[indices] += 0.5
        for name in state.selection.head_parameter_names:
            params[name].add_(0.1)
        expected = model(**batch()).logits
    adapter = BitFitAdapter.from_model(model)
    adapter.save_pretrained(str(tmp_path))
    cfg = adapter.config
    assert cfg.method == config_class.method and cfg.method_config == {"random_seed": 4}
    assert sorted(cfg.sparse_parameters) == sorted(state.sparse_indices)
    sparse_keys = {n + s for n in state.sparse_indices for s in (INDICES_SUFFIX, VALUES_SUFFIX)}
    head_keys = set(state.selection.head_parameter_names)
    assert set(adapter.tensors) == sparse_keys | head_keys  # no dense weight matrix anywhere
    stored = sum(t.numel() * t.element_size() for t in adapter.tensors.values())
    assert stored == state.reference_count * (8 + 4) + sum(params[n].numel() * 4 for n in head_keys)
    size = os.path.getsize(tmp_path / WEIGHTS_NAME)
    dense = sum(params[n].numel() * 4 for n in state.sparse_indices)
    assert stored < size < stored + 64 * 1024 and size < dense

    stock = tiny_model(arch, seed=0)  # same base weights, fresh head
    BitFitAdapter.from_pretrained(str(tmp_path)).apply_to(stock)
    with torch.no_grad():
        assert torch.equal(stock(**batch()).logits, expected)
    loaded = dict(stock.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(loaded[name], param), name


def test_adapter_loads_its_recorded_indices_even_if_a_draw_differs(tmp_path):
    model = tiny_model("bert")
    state = apply_method(model, RandUniformConfig(random_seed=4))
    adapter = BitFitAdapter.from_model(model)
    adapter.config.method_config = {"random_seed": 5}  # a loader would draw other entries
    stock = tiny_model("bert")
    adapter.apply_to(stock)
    recorded = random_model.RandomSubsetState
    loaded_state = stock._bitfit_state
    assert isinstance(loaded_state, recorded)
    assert all(torch.equal(loaded_state.sparse_indices[n], state.sparse_indices[n]) for n in state.sparse_indices)


def test_info_shows_method_and_count(tmp_path):
    model = tiny_model("bert")
    state = apply_method(model, RandRowColConfig(random_seed=9))
    BitFitAdapter.from_model(model).save_pretrained(str(tmp_path))
    rows = dict(describe(BitFitAdapter.from_directory(str(tmp_path)), str(tmp_path)))
    assert rows["method"].startswith(f"rand_row_col ({state.reference_count:,} weight entries")
    assert "bitfit all" in rows["method"] and "random_seed 9" in rows["method"]
    assert f"{state.reference_count:,} outside the head" in rows["parameters"]


def test_bank_switches_a_random_adapter_and_mixed_batches_refuse_it(tmp_path):
    model = tiny_model("bert")
    state = apply_method(model, RandUniformConfig(random_seed=1))
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, indices in state.sparse_indices.items():
            params[name].view(-1)[indices] -= 0.3
        expected = model(**batch()).logits
    BitFitAdapter.from_model(model).save_pretrained(str(tmp_path / "rand"))
    base = tiny_model("bert")
    with torch.no_grad():
        base_logits = base(**batch()).logits
    bank = AdapterBank(base)
    bank.add("rand", str(tmp_path / "rand"))
    bank.activate("rand")
    with torch.no_grad():
        assert torch.equal(base(**batch()).logits, expected)
    bank.restore_base()
    with torch.no_grad():
        assert torch.equal(base(**batch()).logits, base_logits)
    with pytest.raises(AdapterError, match="uses rand_uniform: .*mixed-task batches route biases and heads only"):
        MultiTaskModel(bank)


def test_zero3_is_refused_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(random_model, "zero3_enabled", lambda: True)
    with pytest.raises(random_model.UnsupportedSetupError, match="ZeRO-3 is not supported.*DDP or ZeRO-1/2"):
        apply_method(tiny_model("bert"), RandUniformConfig())


def test_config_round_trip_and_bad_values():
    cfg = config_from_dict("rand_row_col", {"bias_terms": "paper-subset", "random_seed": 3})
    assert isinstance(cfg, RandRowColConfig) and cfg.bias_terms == ["paper-subset"] and cfg.random_seed == 3
    with pytest.raises(ValueError, match="matches the size of a bias selection"):
        RandUniformConfig(bias_terms="full")
    with pytest.raises(ValueError, match="random_seed"):
        RandUniformConfig(random_seed=-1)
    with pytest.raises(ValueError, match="add_missing_biases"):  # LLaMA has no bias to match without it
        apply_method(tiny_model("llama"), RandUniformConfig())


def test_real_minilm_count_masks_and_round_trip(minilm_dir, tmp_path):
    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = _dataset(model.config.vocab_size, n=8)
    for item in data:
        item["labels"] = item["labels"] % 2
    trainer = BitFitTrainer(model, _args(tmp_path, max_steps=2, learning_rate=1e-2), train_dataset=data,
                            method_config=RandRowColConfig(random_seed=0))
    # counted on the model as trained: the trainer classifies from MiniLM's mean pooling and drops its pooler
    expected_count = reference(model, "bert")
    state = trainer.tuner_state
    assert state.reference_count == expected_count == state.summary.bias_params
    trainer.train()
    for name, idx in _changed_entries(model, before).items():
        if not name.startswith("classifier"):
            assert set(idx.tolist()) <= set(state.sparse_indices[name].tolist()), name
    trainer.save_model(str(tmp_path / "adapter"))
    size = os.path.getsize(tmp_path / "adapter" / WEIGHTS_NAME)
    assert size < expected_count * 12 + 64 * 1024  # entries + head, not MiniLM's 80 MB of matrices
    model.eval()
    with torch.no_grad():
        expected = model(**batch(model.config.vocab_size)).logits
    stock = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()
    BitFitAdapter.from_pretrained(str(tmp_path / "adapter")).apply_to(stock)
    with torch.no_grad():
        assert torch.equal(stock(**batch(model.config.vocab_size)).logits, expected)


def test_merged_export_of_a_random_adapter(tmp_path):
    """Merging needs no new place in the architecture: the trained entries live in existing matrices."""
    from bitfit_hf import export_merged

    model = tiny_model("gpt2")
    state = apply_method(model, RandRowColConfig(random_seed=2))
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, indices in state.sparse_indices.items():
            params[name].view(-1)[indices] *= 1.5
        expected = model(**batch()).logits
    BitFitAdapter.from_model(model).save_pretrained(str(tmp_path / "adapter"))
    stock = tiny_model("gpt2")
    BitFitAdapter.from_directory(str(tmp_path / "adapter")).apply_to(stock)
    export_merged(stock, str(tmp_path / "merged"))
    plain = T.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        assert torch.equal(plain(**batch()).logits, expected)


def test_model_card_describes_weight_entries_not_biases():
    from bitfit_hf.reporting.model_card import build_model_card

    model = tiny_model("bert")
    state = apply_method(model, RandUniformConfig(random_seed=2))
    text = str(build_model_card(BitFitAdapter.from_model(model)))
    assert f"trains **{state.reference_count:,} weight entries**" in text
    assert "A **rand_uniform** baseline adapter" in text and "bias parameters**" not in text


def test_layerwise_decay_reaches_the_random_entries():
    from bitfit_hf.training.optim import parameter_groups

    model = tiny_model("bert")
    state = apply_method(model, RandUniformConfig(layerwise_lr_decay=0.5))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = parameter_groups(model, state, 1e-2, 0.1, [n for n, _ in model.named_parameters()])
    rates = {names[id(p)]: (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    assert rates["bert.encoder.layer.1.attention.self.query.weight"] == (pytest.approx(1e-2), 0.0)
    assert rates["bert.encoder.layer.0.attention.self.query.weight"] == (pytest.approx(5e-3), 0.0)
    assert rates["classifier.weight"] == (pytest.approx(1e-2), 0.1)  # the head decays as in Trainer


def test_resume_from_a_checkpoint_continues_exactly(tmp_path):
    """checkpoint-2 holds the compact adapter + optimizer state; resuming to step 4 gives the same weights."""
    data = _dataset(100)

    def run(out, resume=None):
        model = tiny_model("bert").train()
        trainer = BitFitTrainer(model, _args(tmp_path, output_dir=str(out), save_strategy="steps", save_steps=2),
                                train_dataset=data, method_config=RandRowColConfig(random_seed=6))
        trainer.train(resume_from_checkpoint=resume)
        return model

    full = run(tmp_path / "full")
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert (checkpoint / WEIGHTS_NAME).is_file()
    resumed = run(tmp_path / "resumed", resume=str(checkpoint))
    theirs = dict(full.named_parameters())
    for name, param in resumed.named_parameters():
        assert torch.equal(param, theirs[name]), name
