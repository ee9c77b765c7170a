"""Batches in a few fixed shapes (bitfit_hf/training/static_shapes.py): the buckets, the padding, and a model's
outputs unchanged by the bucket an example lands in."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from tokenizers import Tokenizer, models, pre_tokenizers

from bitfit_hf.training.static_shapes import BucketPadding, length_buckets, parse_buckets


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]"] + [f"w{i}" for i in range(60)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def _features(tokenizer, lengths, labels=True):
    rows = []
    for i, n in enumerate(lengths):
        encoded = tokenizer(" ".join(f"w{(i + j) % 60}" for j in range(n)))
        row = dict(encoded)
        if labels:
            row["label"] = i % 2
        rows.append(row)
    return rows


def test_length_buckets():
    assert length_buckets(128) == (16, 32, 64, 128)
    assert length_buckets(100) == (16, 32, 56, 100)
    assert length_buckets(12) == (8, 12)  # nothing below the multiple, nothing above max_length
    assert length_buckets(384, count=2) == (192, 384)
    with pytest.raises(ValueError, match="positive"):
        length_buckets(0)
    assert parse_buckets("64, 32,128") == (32, 64, 128)
    for bad in ("", "a,b", "0,8"):
        with pytest.raises(ValueError, match="--length_buckets"):
            parse_buckets(bad)


def test_batches_are_padded_to_the_smallest_bucket_that_holds_them(tokenizer):
    collate = BucketPadding(T.DataCollatorWithPadding(tokenizer), (8, 16, 32))
    assert collate(_features(tokenizer, [3, 5]))["input_ids"].shape == (2, 8)
    assert collate(_features(tokenizer, [3, 9]))["input_ids"].shape == (2, 16)
    assert collate(_features(tokenizer, [16, 1]))["input_ids"].shape == (2, 16)
    assert collate(_features(tokenizer, [40, 1]))["input_ids"].shape == (2, 40)  # past every bucket: its own length
    batch = collate(_features(tokenizer, [3, 5]))
    assert batch["attention_mask"].sum(1).tolist() == [3, 5] and batch["labels"].tolist() == [0, 1]


def test_token_labels_are_padded_with_the_ignore_index(tokenizer):
    collate = BucketPadding(T.DataCollatorForTokenClassification(tokenizer), (8, 16))
    features = _features(tokenizer, [3, 5], labels=False)
    for row in features:
        row["labels"] = [1] * len(row["input_ids"])
    batch = collate(features)
    assert batch["labels"].shape == (2, 8)
    assert batch["labels"][0].tolist() == [1, 1, 1] + [-100] * 5


def test_outputs_do_not_depend_on_the_bucket(tokenizer):
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(T.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=62,
        num_labels=2)).eval()
    features = _features(tokenizer, [3, 7, 5], labels=False)
    exact = T.DataCollatorWithPadding(tokenizer)(features)
    bucketed = BucketPadding(T.DataCollatorWithPadding(tokenizer), (32,))(features)
    assert bucketed["input_ids"].shape[1] == 32 != exact["input_ids"].shape[1]
    with torch.no_grad():
        assert torch.allclose(model(**exact).logits, model(**bucketed).logits, atol=1e-6)


def test_only_padding_collators_are_wrapped():
    with pytest.raises(TypeError, match="padding collator"):
        BucketPadding(T.default_data_collator, (8,))


def test_a_compiled_classifier_compiles_once_for_one_shape(tmp_path):
    """The classifier fixes its problem_type on its first forward; BitFitTrainer fixes it before, so the second
    step does not compile again (dynamo's own count of the graphs it compiled)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from bitfit_hf import BitFitConfig, BitFitTrainer
    from bitfit_hf.training.static_shapes import settle_problem_type

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(T.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                         intermediate_size=64, vocab_size=60, num_labels=2))
    ids = torch.randint(2, 60, (24, 8), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": int(ids[i, 1] % 2)}
            for i in range(24)]
    args = T.TrainingArguments(str(tmp_path), max_steps=3, per_device_train_batch_size=8, report_to=[], use_cpu=True,
                               save_strategy="no", torch_compile=True, torch_compile_backend="eager")
    BitFitTrainer(model, args, train_dataset=rows, method_config=BitFitConfig()).train()
    compiled = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert model.config.problem_type == "single_label_classification"
    assert compiled == 1, f"compiled {compiled} graphs for one batch shape"
    regression = T.BertForSequenceClassification(T.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                              intermediate_size=64, vocab_size=60, num_labels=1))
    assert settle_problem_type(regression, torch.zeros(2)) == "regression"
    assert settle_problem_type(regression, torch.zeros(2)) is None  # once set, left alone
