"""``frozen_dtype``: frozen Linear weights stored in bf16 under bf16 autocast (CPU here; the GPU path is the same
code). The training computes the same numbers as the float32-master run, trained tensors and optimizer state stay
float32, frozen tensors never change, adapters reload exactly and fingerprints do not move."""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch
import transformers as T

from bitfit_hf import BitFitAdapter, BitFitConfig, BitFitTrainer, apply_bitfit
from bitfit_hf.training.frozen_dtype import FrozenDtypeError, cast_frozen_weights, castable_parameters, resolve_frozen_dtype
from bitfit_hf.tuners.bitfit_ia3.config import BitFitIA3Config
from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig
from bitfit_hf.utils.fingerprint import base_fingerprint

try:
    from tests.support.tiny_training import RandomLabelTokens, quiet_cpu_training_args, tiny_bert_classifier
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.tiny_training import RandomLabelTokens, quiet_cpu_training_args, tiny_bert_classifier  # type: ignore[no-redef]

CONFIGS = {
    "bitfit": lambda: BitFitConfig("all"),
    "bitfit_lora": lambda: BitFitLoraConfig(bias_terms="all"),
    "bitfit_ia3": lambda: BitFitIA3Config(bias_terms="all"),
}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _args(tmp_path, **kw):
    return quiet_cpu_training_args(tmp_path, **{"per_device_train_batch_size": 4, "learning_rate": 1e-2, "bf16": True, **kw})


def _inputs():
    g = torch.Generator().manual_seed(3)
    return {"input_ids": torch.randint(5, 100, (3, 12), generator=g)}


def _digests(model):
    return {n: hashlib.blake2b(p.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            for n, p in model.named_parameters()}


def _train(tmp_path, method, frozen_dtype, **kw):
    model = tiny_bert_classifier()
    trainer = BitFitTrainer(model, _args(tmp_path, **kw), train_dataset=RandomLabelTokens(), method_config=CONFIGS[method](),
                            frozen_dtype=frozen_dtype)
    return model, trainer


def test_only_frozen_linear_weights_are_cast():
    model = tiny_bert_classifier()
    apply_bitfit(model, BitFitConfig("all"))
    count = cast_frozen_weights(model, "bfloat16")
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    cast = {n for n, d in dtypes.items() if d == torch.bfloat16}
    linear_weights = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)} - {"classifier.weight"}
    assert cast == linear_weights and count == len(cast) == 2 * 6 + 1  # q k v o, FFN in / out per layer; the pooler
    assert all(dtypes[n] == torch.float32 for n, p in model.named_parameters() if p.requires_grad)  # biases, head
    assert dtypes["bert.embeddings.word_embeddings.weight"] == torch.float32  # not an autocast product
    assert dtypes["bert.embeddings.LayerNorm.weight"] == torch.float32  # a bf16 gain beside a float32 bias fails
    assert castable_parameters(model) == []  # nothing left to cast: a second call is a no-op
    assert cast_frozen_weights(model, torch.float32) == count and "forward" not in vars(model)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_tied_weights_stay_float32():
    torch.manual_seed(0)
    model = T.BertForMaskedLM(T.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=64, vocab_size=100))
    for p in model.parameters():
        p.requires_grad_(False)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    names = [n for n, _ in castable_parameters(model)]
    assert names and not any("decoder" in n or "word_embeddings" in n for n in names)


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_training_computes_what_the_float32_master_run_computes(tmp_path, method):
    """Autocast rounds each frozen weight to bf16 on every call; storing it rounded changes no number."""
    reference, ref_trainer = _train(tmp_path / "fp32", method, "float32")  # each built, then trained: same RNG
    assert ref_trainer.frozen_dtype is None
    ref_trainer.train()
    model, trainer = _train(tmp_path / "bf16", method, "bfloat16")
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert any(p.dtype == torch.bfloat16 for p in model.parameters())
    before = _digests(model)
    trainer.train()
    after = _digests(model)
    assert {n for n in before if before[n] != after[n]} == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(before[n] == after[n] for n in frozen)  # bit-identical across training
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    expected = dict(reference.named_parameters())
    for name, param in trained.items():
        assert param.dtype == torch.float32
        assert torch.equal(param, expected[name]), name
    states = [v for state in trainer.optimizer.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]
    assert states and all(v.dtype == torch.float32 for v in states)


def test_adapter_reloads_exactly(tmp_path):
    model, trainer = _train(tmp_path, "bitfit_lora", "bfloat16")
    trainer.train()
    model.eval()
    with torch.no_grad():
        trained = model(**_inputs()).logits.float()
    trainer.save_model(str(tmp_path / "adapter"))
    adapter = BitFitAdapter.from_pretrained(str(tmp_path / "adapter"))
    assert adapter.tensors and all(t.dtype == torch.float32 for t in adapter.tensors.values())
    assert adapter.config.metadata["frozen_dtype"] == "bfloat16" and adapter.config.dtype == "float32"

    stock = adapter.apply_to(tiny_bert_classifier()).eval()  # a stock float32 base: fingerprint accepted
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast makes the casts the training stored
            assert torch.equal(stock(**_inputs()).logits.float(), trained)
        plain = stock(**_inputs()).logits
    # plain float32 on the float32 base: off by the bf16 rounding of the frozen weights (measured 0.4% of the largest
    # logit here, 0.3-0.9% for bitfit / bitfit_lora / bitfit_ia3; the documented tolerance is 2%)
    assert 0 < (plain - trained).abs().max().item() <= 0.02 * trained.abs().max().item()
    cast_frozen_weights(stock, "bfloat16")  # cast the same way: a plain forward is exact too
    with torch.no_grad():
        assert torch.equal(stock(**_inputs()).logits.float(), trained)


def test_fingerprint_is_the_same_in_either_dtype(tmp_path):
    model, trainer = _train(tmp_path, "bitfit", "bfloat16")
    state = trainer.tuner_state
    names = set(state.selection.parameter_names)
    cast = base_fingerprint(model, exclude=names, head_modules=state.selection.head_modules)
    assert cast == state.fingerprint == base_fingerprint(tiny_bert_classifier(), exclude=names,
                                                         head_modules=state.selection.head_modules)
    trainer.save_model(str(tmp_path / "adapter"))
    BitFitAdapter.from_pretrained(str(tmp_path / "adapter")).apply_to(model)  # onto the bf16 model itself: accepted


def test_plain_forward_runs_under_autocast_and_a_copy_keeps_its_own_weights():
    model = tiny_bert_classifier().eval()
    apply_bitfit(model, BitFitConfig("all"))
    reference = copy.deepcopy(model)
    cast_frozen_weights(model, "bfloat16")
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = reference(**_inputs()).logits
        assert torch.equal(model(**_inputs()).logits, expected)  # no autocast around it: the wrapper enters one
        twin = copy.deepcopy(model)
        twin.classifier.bias.add_(1.0)
        assert torch.equal(model(**_inputs()).logits, expected)  # the copy's forward reads the copy's weights
        assert not torch.equal(twin(**_inputs()).logits, expected)
    assert torch.equal(model.classifier.bias, reference.classifier.bias)


def test_auto_and_refusals(tmp_path):
    _, trainer = _train(tmp_path, "bitfit", "auto")
    assert trainer.frozen_dtype is None  # auto on a CPU: float32, as measured there
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    with pytest.raises(FrozenDtypeError, match="--bf16"):
        _train(tmp_path, "bitfit", "bfloat16", bf16=False)
    full = BitFitConfig("full")
    with pytest.raises(FrozenDtypeError, match="full fine-tuning"):
        resolve_frozen_dtype("bfloat16", _args(tmp_path), full, None)
    with pytest.raises(FrozenDtypeError, match="save_full_model"):
        resolve_frozen_dtype("bfloat16", _args(tmp_path), BitFitConfig("all", save_full_model=True), None)
    with pytest.raises(FrozenDtypeError, match="choose one of"):
        resolve_frozen_dtype("float16", _args(tmp_path), BitFitConfig("all"), None)
    assert resolve_frozen_dtype("auto", _args(tmp_path), full, None) is None
