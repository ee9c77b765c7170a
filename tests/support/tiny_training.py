"""Pieces of the short CPU training runs in the trainer and tuner tests: a seeded tiny BERT classifier, seeded
token datasets and TrainingArguments for a 3-step run that saves, logs and prints nothing."""

from __future__ import annotations

import torch
import transformers as T
from datasets import Dataset


def tiny_bert_classifier(seed: int = 0) -> T.BertForSequenceClassification:
    """A seeded 2-layer BERT with a 2-label head, built directly (training mode): the trainer tests' model."""
    torch.manual_seed(seed)
    cfg = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       vocab_size=100, num_labels=2)
    return T.BertForSequenceClassification(cfg)


class RandomLabelTokens(torch.utils.data.Dataset):
    """``n`` rows of 12 random token ids with random binary labels (seed 0): data for a few trainer steps."""

    def __init__(self, n=16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, 12), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def parity_dataset(vocab: int, n: int = 16, length: int = 12) -> Dataset:
    """Random token rows (seed 5) labelled by the parity of their second token: a task a few steps can learn."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * length] * n,
                              "labels": (ids[:, 1] % 2).tolist()})


def quiet_cpu_training_args(tmp_path, **overrides) -> T.TrainingArguments:
    """TrainingArguments of a quiet 3-step CPU run: no checkpoints, logs or progress bars (``overrides`` win)."""
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=3, learning_rate=2e-2,
                report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
    base.update(overrides)
    return T.TrainingArguments(**base)
