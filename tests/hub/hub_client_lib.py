"""Imported by the client subprocesses of the hub tests (``tests/hub`` is on their ``PYTHONPATH``).

The subprocesses run the real ``huggingface_hub`` client with ``HF_ENDPOINT`` set before it is
imported; these helpers build tiny BERT bases and BitFit adapters, compute logits on a fixed batch,
and report exceptions (class, message, whether a raw HTTP traceback would be shown).
"""

from __future__ import annotations

import os
import traceback

import torch
from transformers import BertConfig, BertForSequenceClassification

VOCAB = 100


def make_base(path: str, seed: int = 0, num_labels: int = 2) -> str:
    """A randomly initialised tiny BERT classifier saved with ``save_pretrained`` (the "stock base")."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, num_labels=num_labels)
    BertForSequenceClassification(config).save_pretrained(path)
    return path


def load_base(path: str, num_labels: int = 2):
    """The stock base; another label count re-initialises its head (the adapter carries the head)."""
    return BertForSequenceClassification.from_pretrained(path, num_labels=num_labels,
                                                         ignore_mismatched_sizes=num_labels != 2).eval()


def fake_trained(base_path: str, seed: int = 1, num_labels: int = 2, scale: float = 0.05, bias_terms="all"):
    """A base prepared with BitFit whose trained tensors were moved (deterministically, by ``seed``)."""
    from bitfit_hf import BitFitConfig, apply_bitfit

    model = load_base(base_path, num_labels)
    apply_bitfit(model, BitFitConfig(bias_terms=bias_terms))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                # b_q moves most, b_k least: the heat map must show it.
                factor = 4.0 if "query" in name else (0.25 if ".key." in name else 1.0)
                param.add_(torch.randn(param.shape, generator=generator) * scale * factor)
    return model.eval()


def batch(n: int = 4, length: int = 10, seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (n, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def logits(model, inputs=None) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**(inputs or batch())).logits.detach().clone()


def tokens_dataset(n: int = 32, length: int = 10, seed: int = 0, num_labels: int = 2, vocab: int = VOCAB):
    """A learnable toy task: the label is the first token id modulo ``num_labels``."""
    from datasets import Dataset

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, length), generator=generator)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * length] * n,
                              "labels": (ids[:, 0] % num_labels).tolist()})


def accuracy(eval_prediction) -> dict:
    predictions, labels = eval_prediction
    return {"accuracy": float((predictions.argmax(-1) == labels).mean())}


def catch(fn, *args, **kwargs):
    """``None`` if ``fn`` succeeds, else what a user would see of the exception."""
    try:
        fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - reported to the test
        shown = "".join(traceback.format_exception(err))
        return {
            "error": type(err).__name__,
            "mro": [c.__name__ for c in type(err).__mro__],
            "message": str(err),
            "chained": err.__cause__ is not None or (err.__context__ is not None and not err.__suppress_context__),
            "traceback": shown,
        }
    return None


def files_under(root: str):
    out = []
    for folder, _dirs, names in os.walk(root):
        out.extend(os.path.relpath(os.path.join(folder, n), root) for n in names)
    return sorted(out)


def files_containing(root: str, needle: str):
    data = needle.encode()
    hits = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as handle:
                    if data in handle.read():
                        hits.append(path)
            except OSError:
                pass
    return hits
