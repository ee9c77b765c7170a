"""AdapterBias's L0 option (``l0_lambda``): hard-concrete gates on L_alpha's input weights. Only the method's
tensors move; the penalty reaches BitFitTrainer's loss and closes gates; the saved adapter holds the gates folded in
(pruned weights exact zeros) and reloads to the eval-mode logits; a checkpoint resumes exactly; l0_lambda=0 is the
plain method bit for bit; bad values are refused."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import batch, tiny_model

from bitfit_hf import BitFitAdapter, BitFitTrainer, load_adapter, save_adapter
from bitfit_hf.recipe_kit.args import BitFitArguments
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.tuners import apply_method, describe_method
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
from bitfit_hf.tuners.adapterbias.config import GATE
from bitfit_hf.tuners.adapterbias.l0 import BETA, GAMMA, ZETA, HardConcreteGate, gates_of
from bitfit_hf.utils.constants import SUMMARY_NAME

try:
    from tests.support.tiny_training import parity_dataset, quiet_cpu_training_args
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.tiny_training import parity_dataset, quiet_cpu_training_args  # type: ignore[no-redef]

D_FF, LAYERS = 64, 2  # the tiny BERT's FFN width and depth


def _train(tmp_path, config, **kw):
    model = tiny_model("bert", num_labels=2)
    trainer = BitFitTrainer(model, quiet_cpu_training_args(tmp_path, **kw),
                            train_dataset=parity_dataset(model.config.vocab_size, n=32), method_config=config)
    trainer.train()
    model.eval()
    return model, trainer


def test_gates_sit_on_l_alpha_inputs_and_only_the_methods_tensors_move(tmp_path):
    model = tiny_model("bert", num_labels=2)
    inputs = batch()
    with torch.no_grad():
        stock = model(**inputs).logits
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = AdapterBiasConfig(l0_lambda=1e-2)
    state = apply_method(model, config)
    gates = gates_of(model)
    assert sorted(gates) == [f"bert.encoder.layer.{i}.output.dense.token_shift.alpha.l0_gate" for i in range(LAYERS)]
    assert all(g.log_alpha.shape == (D_FF,) for g in gates.values())  # one gate per input weight of L_alpha
    assert [e.numel for e in state.selection.entries if e.role == GATE] == [D_FF] * LAYERS
    with torch.no_grad():  # v = 0 and every gate starts open: the stock outputs
        assert torch.equal(model(**inputs).logits, stock)

    trainer = BitFitTrainer(model, quiet_cpu_training_args(tmp_path), train_dataset=parity_dataset(model.config.vocab_size, n=32),
                            method_config=config)
    assert any(abs(g["lr"] - 0.1) < 1e-12 for g in trainer.create_optimizer().param_groups)  # the gates' own rate
    trainer.train()
    after = dict(model.named_parameters())
    moved = {n for n in after if n not in before or not torch.equal(after[n], before[n])}
    assert moved == set(state.selection.parameter_names)  # everything else bit-identical
    assert all(n in moved for n in after if n.endswith("log_alpha"))


def test_shared_alpha_has_one_gate_vector():
    model = tiny_model("bert", num_labels=2)
    state = apply_method(model, AdapterBiasConfig(share_alpha=True, l0_lambda=1e-2))
    assert list(gates_of(model)) == ["bert.token_shift_alpha.l0_gate"]
    assert [e.name for e in state.selection.entries if e.role == GATE] == ["bert.token_shift_alpha.l0_gate.log_alpha"]


def test_gate_follows_the_hard_concrete_distribution():
    gate = HardConcreteGate(4, torch.zeros(1))
    with torch.no_grad():
        gate.log_alpha.copy_(torch.tensor([-6.0, 0.0, 1.0, 6.0]))
    gate.eval()
    expected = (torch.sigmoid(gate.log_alpha) * (ZETA - GAMMA) + GAMMA).clamp(0, 1)
    assert torch.equal(gate(), expected) and gate()[0] == 0 and gate()[3] == 1  # exact zeros and ones
    gate.train()
    torch.manual_seed(0)
    samples = torch.stack([gate().detach() for _ in range(4000)])
    assert samples.min() >= 0 and samples.max() <= 1
    p_open = torch.sigmoid(gate.log_alpha.detach() - BETA * math.log(-GAMMA / ZETA))  # P(z != 0)
    assert torch.allclose((samples > 0).float().mean(0), p_open, atol=0.03)
    assert torch.allclose(gate.last_expected_l0, p_open.sum())


def test_the_penalty_reaches_the_trainers_loss(tmp_path):
    model = tiny_model("bert", num_labels=2)
    config = AdapterBiasConfig(l0_lambda=0.5)
    trainer = BitFitTrainer(model, quiet_cpu_training_args(tmp_path), train_dataset=parity_dataset(model.config.vocab_size, n=32),
                            method_config=config)
    inputs = {**batch(), "labels": torch.tensor([0, 1, 1, 0])}
    model.train()
    torch.manual_seed(3)
    loss = trainer.compute_loss(model, dict(inputs))
    torch.manual_seed(3)
    task = model(**inputs).loss
    expected = sum(torch.sigmoid(g.log_alpha - BETA * math.log(-GAMMA / ZETA)).sum() for g in gates_of(model).values())
    assert torch.allclose(loss, task + 0.5 * expected)
    loss.backward()
    assert all(g.log_alpha.grad is not None and g.log_alpha.grad.abs().sum() > 0 for g in gates_of(model).values())
    model.eval()  # evaluation: the task loss alone
    assert torch.equal(trainer.compute_loss(model, dict(inputs)), model(**inputs).loss)


def test_the_penalty_closes_gates(tmp_path):
    """Every gate starts open; the penalty lowers the expected count of open gates (more for a larger l0_lambda) and
    prunes weights. (30 steps at the gates' rate 0.5, linearly decayed, can move a gate 7.5: enough to close one.)"""
    counts = {}
    for l0_lambda in (1e-4, 0.5):
        config = AdapterBiasConfig(l0_lambda=l0_lambda, l0_learning_rate=0.5)
        model, trainer = _train(tmp_path / str(l0_lambda), config, max_steps=30)
        counts[l0_lambda] = trainer.tuner_state.summary.notes["l0"]
    start = 2 * D_FF * torch.sigmoid(torch.tensor(3.0 - BETA * math.log(-GAMMA / ZETA))).item()
    strong, weak = counts[0.5], counts[1e-4]
    assert strong["gated"] == weak["gated"] == 2 * D_FF
    assert strong["expected_active"] < weak["expected_active"] < start - 10
    assert strong["active"] < strong["gated"] and weak["active"] < weak["gated"]


def test_saved_adapter_folds_the_gates_and_reloads_to_the_eval_logits(tmp_path):
    model, trainer = _train(tmp_path, AdapterBiasConfig(l0_lambda=1e-2), max_steps=2)
    gates = gates_of(model)
    with torch.no_grad():  # close some gates for certain, leave others open or half open
        for gate in gates.values():
            gate.log_alpha[::3] = -5.0
            gate.log_alpha[1::3] = 0.3
    inputs = batch()
    with torch.no_grad():
        trained = model(**inputs).logits
    out = tmp_path / "adapter"
    trainer.save_model(str(out))

    adapter = BitFitAdapter.from_directory(str(out))
    assert not any("log_alpha" in n for n in adapter.tensors) and not any("log_alpha" in n for n in adapter.config.trained_parameters)
    for name, gate in gates.items():
        weight = adapter.tensors[name.rsplit(".", 1)[0] + ".weight"][0]
        closed = gate.deterministic() == 0
        assert closed.sum() == (D_FF + 2) // 3 and torch.all(weight[closed] == 0)  # pruned: exact zeros
        assert torch.all(weight[~closed] != 0)
    folded = adapter.config.method_config["l0_folded"]
    assert folded["gated"] == LAYERS * D_FF and folded["active"] == LAYERS * (D_FF - (D_FF + 2) // 3)
    assert adapter.config.method_config["l0_lambda"] == 1e-2

    fresh = tiny_model("bert", num_labels=2)
    load_adapter(fresh, str(out))
    assert not gates_of(fresh)  # a plain AdapterBias model: the zeros do the pruning
    with torch.no_grad():
        assert torch.equal(fresh(**inputs).logits, trained)

    # the summary, `info` and the model card state the expected-active count
    summary = json.loads((out / SUMMARY_NAME).read_text())
    assert summary["notes"]["l0"]["expected_active"] == folded["expected_active"]
    assert summary["notes"]["l0"]["active"] == folded["active"]
    # the gates train but are folded away: the summary says what the adapter stores, matching its tensors
    stored = sum(t.numel() for t in adapter.tensors.values())
    assert summary["trainable_params"] == stored + folded["gated"]
    assert summary["notes"]["l0"]["stored_params"] == stored
    line = describe_method(adapter.config)
    assert f"{folded['active']} of {LAYERS * D_FF} L_alpha input weights kept, expected_active={folded['expected_active']}" in line
    assert line.startswith("adapterbias (alpha_init_seed=0, norm_roles=")
    from bitfit_hf.reporting.model_card import build_model_card

    card = str(build_model_card(adapter))
    assert "expected_active" in card and str(folded["expected_active"]) in card


def test_save_adapter_folds_and_a_checkpoint_keeps_the_gates(tmp_path):
    model = tiny_model("bert", num_labels=2)
    apply_method(model, AdapterBiasConfig(l0_lambda=1e-2))
    with torch.no_grad():
        for gate in gates_of(model).values():
            gate.log_alpha[:10] = -4.0
        model.bert.encoder.layer[0].output.dense.token_shift.vector.fill_(0.5)
    inputs = batch()
    with torch.no_grad():
        trained = model(**inputs).logits
    save_adapter(model, str(tmp_path / "released"))
    checkpoint = BitFitAdapter.from_model(model, release=False)
    assert any(n.endswith("l0_gate.log_alpha") for n in checkpoint.tensors)
    checkpoint.save_pretrained(str(tmp_path / "checkpoint"))
    for folder in ("released", "checkpoint"):
        fresh = tiny_model("bert", num_labels=2).eval()
        load_adapter(fresh, str(tmp_path / folder))
        assert bool(gates_of(fresh)) == (folder == "checkpoint")
        with torch.no_grad():
            assert torch.equal(fresh(**inputs).logits, trained), folder


def test_checkpoint_resumes_exactly(tmp_path):
    config = AdapterBiasConfig(l0_lambda=1e-2)
    full, _ = _train(tmp_path / "full", config, max_steps=4)
    _train(tmp_path / "first", config, max_steps=4, save_strategy="steps", save_steps=2,
           output_dir=str(tmp_path / "resume"))
    model = tiny_model("bert", num_labels=2)
    trainer = BitFitTrainer(model, quiet_cpu_training_args(tmp_path, max_steps=4, output_dir=str(tmp_path / "resume")),
                            train_dataset=parity_dataset(model.config.vocab_size, n=32), method_config=config)
    trainer.train(resume_from_checkpoint=str(tmp_path / "resume" / "checkpoint-2"))
    ours, theirs = dict(model.named_parameters()), dict(full.named_parameters())
    assert all(torch.equal(ours[n], theirs[n]) for n in theirs)


def test_l0_lambda_zero_is_the_plain_method(tmp_path):
    plain, plain_trainer = _train(tmp_path / "plain", AdapterBiasConfig())
    zero, zero_trainer = _train(tmp_path / "zero", AdapterBiasConfig(l0_lambda=0.0))
    assert not gates_of(zero)
    a, b = dict(plain.named_parameters()), dict(zero.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    plain_trainer.save_model(str(tmp_path / "a"))
    zero_trainer.save_model(str(tmp_path / "b"))
    assert (tmp_path / "a" / "adapter_model.safetensors").read_bytes() == (tmp_path / "b" / "adapter_model.safetensors").read_bytes()
    assert "l0" not in json.dumps(BitFitAdapter.from_directory(str(tmp_path / "b")).config.method_config)


@pytest.mark.parametrize("fields", [
    {"l0_lambda": -1e-3}, {"l0_lambda": float("nan")}, {"l0_lambda": float("inf")}, {"l0_lambda": "0.1"},
    {"l0_lambda": True}, {"l0_lambda": 1e-3, "l0_learning_rate": 0.0},
    {"l0_lambda": 1e-3, "l0_folded": {"gated": 3}}, {"l0_folded": {"gated": 3, "active": 1, "expected_active": 1.0}},
])
def test_bad_values_are_refused(fields):
    with pytest.raises(ValueError, match="l0_"):
        AdapterBiasConfig(**fields)


def test_recipe_flags():
    config = BitFitArguments(method="adapterbias", l0_lambda=1e-3).method_config()
    assert config.l0_lambda == 1e-3 and config.l0_learning_rate == 0.1
    assert BitFitArguments(method="adapterbias", l0_lambda=1e-3, l0_learning_rate=0.05).method_config().l0_learning_rate == 0.05
    with pytest.raises(RecipeError, match="--l0_lambda.*>= 0"):
        BitFitArguments(method="adapterbias", l0_lambda=-1.0).method_config()
    with pytest.raises(RecipeError, match="--l0_lambda applies to --method adapterbias only"):
        BitFitArguments(method="bitfit", l0_lambda=1e-3).method_config()
    with pytest.raises(RecipeError, match="only --l0_lambda > 0 adds"):
        BitFitArguments(method="adapterbias", l0_learning_rate=0.05).method_config()
