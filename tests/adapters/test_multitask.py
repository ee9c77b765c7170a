"""MultiTaskModel: one forward over a mixed-task batch equals running each task on its own."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

from bitfit_hf import AdapterBank, BitFitAdapter, BitFitConfig, apply_bitfit
from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.adapters.multitask import MultiTaskModel

ATOL = 1e-4  # float32; the measured largest difference is ~1e-6


def _tiny_config(num_labels=2):
    return T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, num_labels=num_labels)


def _make_adapter(base, num_labels, seed, bias_terms="all", head_cls=T.BertForSequenceClassification):
    """A BitFit adapter trained (here: randomly perturbed) on ``base``'s frozen weights."""
    config = copy.deepcopy(base.config)
    config.num_labels = num_labels
    config.id2label = {i: f"t{seed}_label{i}" for i in range(num_labels)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    torch.manual_seed(seed)
    model = head_cls(config)
    body = base.base_model_prefix
    getattr(model, body).load_state_dict(getattr(base, body).state_dict())
    apply_bitfit(model, BitFitConfig(bias_terms=bias_terms))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.5 * torch.randn(param.shape, generator=g))
    return BitFitAdapter.from_model(model)


def _reference(base, adapters, input_ids, attention_mask, tasks):
    """Each task separately: activate its adapter, run its rows."""
    bank = AdapterBank(copy.deepcopy(base))
    for name, adapter in adapters.items():
        bank.add(name, adapter)
    out = [None] * len(tasks)
    with torch.no_grad():
        for name in adapters:
            rows = [i for i, t in enumerate(tasks) if t == name]
            if not rows:
                continue
            bank.activate(name)
            logits = bank.model(input_ids=input_ids[rows], attention_mask=attention_mask[rows]).logits
            for j, i in enumerate(rows):
                out[i] = logits[j]
    return out


def _batch(n, length, vocab, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[::3, length // 2 :] = 0  # some padding
    return ids, mask


def test_mixed_batch_matches_separate_runs_tiny_bert():
    torch.manual_seed(0)
    base = T.BertForSequenceClassification(_tiny_config()).eval()
    labels = {"a": 2, "b": 3, "c": 5, "d": 1}
    adapters = {name: _make_adapter(base, k, seed=i + 1) for i, (name, k) in enumerate(labels.items())}
    adapters["e"] = _make_adapter(base, 4, seed=9, bias_terms="paper-subset")
    tasks = ["a", "b", "c", "a", "d", "e", "b", "c", "e", "a", "d"]
    ids, mask = _batch(len(tasks), 12, 100)
    expected = _reference(base, adapters, ids, mask, tasks)

    mt = MultiTaskModel(copy.deepcopy(base), adapters)
    with torch.no_grad():
        out = mt(ids, mask, task_ids=tasks)
    assert out.logits.shape == (len(tasks), 5)
    assert out.num_labels == [2, 3, 5, 1, 4]
    for i, (got, want) in enumerate(zip(out.per_example(), expected)):
        assert got.shape == want.shape, (i, got.shape, want.shape)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        assert int(got.argmax()) == int(want.argmax())
        assert torch.isinf(out.logits[i, want.shape[-1]:]).all()
    # indices work as well as names, and a single-task batch equals the plain model
    with torch.no_grad():
        by_index = mt(ids, mask, task_ids=mt.task_index(tasks))
        torch.testing.assert_close(by_index.logits, out.logits)
        single = mt(ids, mask, task_ids=["c"] * len(tasks))
    bank = AdapterBank(copy.deepcopy(base))
    bank.add("c", adapters["c"])
    bank.activate("c")
    with torch.no_grad():
        torch.testing.assert_close(single.logits, bank.model(input_ids=ids, attention_mask=mask).logits, atol=ATOL, rtol=0)


def test_model_is_untouched_outside_forward_and_bank_state_is_respected():
    torch.manual_seed(0)
    base = T.BertForSequenceClassification(_tiny_config()).eval()
    adapters = {"x": _make_adapter(base, 2, seed=1), "y": _make_adapter(base, 3, seed=2)}
    bank = AdapterBank(copy.deepcopy(base))
    for name, adapter in adapters.items():
        bank.add(name, adapter)
    bank.activate("y")  # an active task must not leak into the mixed results
    mt = MultiTaskModel(bank)
    ids, mask = _batch(6, 10, 100)
    tasks = ["x", "y", "x", "y", "y", "x"]
    with torch.no_grad():
        got = mt(ids, mask, task_ids=tasks).per_example()
    expected = _reference(base, adapters, ids, mask, tasks)
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
    # after the call: no hooks left, the head is the real module, the bank still has "y" active
    assert all(not m._forward_hooks for m in bank.model.modules())
    assert isinstance(bank.model.classifier, torch.nn.Linear)
    assert bank.active == "y"
    with torch.no_grad():
        plain = bank.model(input_ids=ids, attention_mask=mask).logits
    assert plain.shape == (6, 3)


def test_errors():
    torch.manual_seed(0)
    base = T.BertForSequenceClassification(_tiny_config()).eval()
    mt = MultiTaskModel(copy.deepcopy(base), {"x": _make_adapter(base, 2, seed=1)})
    ids, mask = _batch(2, 8, 100)
    with pytest.raises(KeyError, match="Unknown task"):
        mt(ids, mask, task_ids=["x", "nope"])
    with pytest.raises(ValueError, match="task ids"):
        mt(ids, mask, task_ids=["x"])
    with pytest.raises(ValueError, match="task_ids"):
        mt(ids, mask)
    with pytest.raises(ValueError, match="at least one"):
        MultiTaskModel(copy.deepcopy(base), {})
    # an adapter that trains a weight matrix through a pattern has no per-example route: refused, naming it
    model = copy.deepcopy(base)
    apply_bitfit(model, BitFitConfig(bias_terms="all", patterns=[r".*attention\.self\.query\.weight"]))
    with pytest.raises(AdapterError, match=r"query\.weight', which no per-example route covers"):
        MultiTaskModel(copy.deepcopy(base), {"w": BitFitAdapter.from_model(model)})


def test_token_classification_heads_are_routed_per_task():
    torch.manual_seed(0)
    base = T.BertForTokenClassification(_tiny_config(3)).eval()
    adapters = {n: _make_adapter(base, k, seed=i + 1, head_cls=T.BertForTokenClassification)
                for i, (n, k) in enumerate({"pos": 7, "ner": 3}.items())}
    tasks = ["pos", "ner", "ner", "pos"]
    ids, mask = _batch(4, 9, 100)
    expected = _reference(base, adapters, ids, mask, tasks)
    with torch.no_grad():
        out = MultiTaskModel(copy.deepcopy(base), adapters)(ids, mask, task_ids=tasks)
    assert out.logits.shape == (4, 9, 7)
    for got, want in zip(out.per_example(), expected):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_minilm_mixed_batch_and_classify(minilm_dir):
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    base = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()
    labels = {"sst2": 2, "mnli": 3, "topic": 6, "score": 1, "polar": 2}
    adapters = {n: _make_adapter(base, k, seed=i + 1) for i, (n, k) in enumerate(labels.items())}
    texts = ["a gripping, beautifully acted film", "the plot goes nowhere", "stocks fell sharply on monday",
             "a man is sleeping", "it was fine, i guess", "the best meal i have had in years",
             "rain is expected tomorrow", "nobody came to the party"]
    tasks = ["sst2", "mnli", "topic", "score", "polar", "sst2", "topic", "mnli"]
    enc = tok(texts, padding=True, return_tensors="pt")
    expected = _reference(base, adapters, enc["input_ids"], enc["attention_mask"], tasks)
    mt = MultiTaskModel(copy.deepcopy(base), adapters, tokenizer=tok)
    with torch.no_grad():
        out = mt(enc["input_ids"], enc["attention_mask"], task_ids=tasks)
    worst = 0.0
    for got, want in zip(out.per_example(), expected):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        assert int(got.argmax()) == int(want.argmax())
        worst = max(worst, float((got - want).abs().max()))
    assert worst < ATOL
    results = mt.classify(texts, tasks, batch_size=3)
    assert [r["task"] for r in results] == tasks
    for r, want, task in zip(results, expected, tasks):
        assert r["label"] == adapters[task].config.id2label[str(int(want.argmax()))]
        assert 0.0 <= r["score"] <= 1.0
    # sentence pairs, mixed with single texts in one batch
    pairs = [("a man is sleeping", "a person rests"), "the plot goes nowhere"]
    mixed = mt.classify(pairs, ["mnli", "sst2"])
    enc_pair = tok(["a man is sleeping"], ["a person rests"], return_tensors="pt")
    with torch.no_grad():
        want = mt(task_ids=["mnli"], **enc_pair).per_example()[0]
    assert mixed[0]["label"] == adapters["mnli"].config.id2label[str(int(want.argmax()))]
    assert abs(mixed[0]["score"] - float(torch.softmax(want, -1).max())) < 1e-4
    all_scores = mt.classify(texts[:2], "topic", top_k=None)
    assert len(all_scores[0]) == 6 and abs(sum(s["score"] for s in all_scores[0]) - 1) < 1e-5


@pytest.mark.parametrize("model_type", ["roberta", "distilbert", "gpt2", "llama", "deberta-v2"])
def test_other_architectures(model_type):
    """Heads made of several modules (DistilBERT), a head module with sub-layers (RoBERTa), fused Conv1D
    biases (GPT-2), and biases added by bitfit-hf to a bias-less model (LLaMA: Linear and RMSNorm hooks)."""
    from conftest import TINY_CONFIGS

    def build(num_labels, seed=0):
        torch.manual_seed(seed)
        config = TINY_CONFIGS[model_type]()
        config.num_labels = num_labels
        return T.AutoModelForSequenceClassification.from_config(config).eval()

    base = build(2)
    biasless = model_type == "llama"
    adapters = {}
    for i, k in enumerate([2, 4, 3]):
        model = build(k, seed=i + 1)
        body = base.base_model_prefix
        getattr(model, body).load_state_dict(getattr(base, body).state_dict())
        apply_bitfit(model, BitFitConfig(bias_terms="all", add_missing_biases=biasless))
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for param in model.parameters():
                if param.requires_grad:
                    param.add_(0.3 * torch.randn(param.shape, generator=g))
        adapters[f"t{i}"] = BitFitAdapter.from_model(model)
    tasks = ["t0", "t1", "t2", "t1", "t0", "t2", "t2"]
    ids, mask = _batch(len(tasks), 10, 100)
    ids[:, 0] = 5  # no pad token in the first position
    expected = _reference(base, adapters, ids, mask, tasks)
    with torch.no_grad():
        out = MultiTaskModel(copy.deepcopy(base), adapters)(ids, mask, task_ids=tasks)
    assert out.num_labels == [2, 4, 3]
    for got, want in zip(out.per_example(), expected):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_adapter_names_alias_and_base_rows_match_the_stock_model():
    """PEFT's spelling: adapter_names=[...] with "__base__" for the stock model (its own biases and head)."""
    torch.manual_seed(0)
    base = T.BertForSequenceClassification(_tiny_config()).eval()
    adapters = {"a": _make_adapter(base, 2, seed=1), "b": _make_adapter(base, 3, seed=2)}
    names = ["a", "__base__", "b", "__base__", "a"]
    ids, mask = _batch(len(names), 10, 100)
    with torch.no_grad():
        stock = copy.deepcopy(base)(input_ids=ids, attention_mask=mask).logits
    expected = _reference(base, adapters, ids, mask, [n if n != "__base__" else None for n in names])
    mt = MultiTaskModel(copy.deepcopy(base), adapters)
    mt.bank.activate("b")  # an active task must not leak into the base rows
    with torch.no_grad():
        out = mt(input_ids=ids, attention_mask=mask, adapter_names=names)
        same = mt(ids, mask, task_ids=names)
    assert torch.equal(out.logits, same.logits)
    assert out.tasks == ["a", "b", "__base__"] and out.num_labels == [2, 3, 2]
    for i, (name, logits) in enumerate(zip(names, out.per_example())):
        reference = stock[i] if name == "__base__" else expected[i]
        assert torch.allclose(logits, reference, atol=ATOL), (name, logits, reference)
    with pytest.raises(ValueError, match="not both"):
        mt(ids, mask, task_ids=names, adapter_names=names)
    with pytest.raises(KeyError, match="__base__"):
        mt(ids, mask, adapter_names=["nope"] * len(names))
