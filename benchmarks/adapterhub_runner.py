#!/usr/bin/env python
"""The ``adapter`` row of ``benchmarks/time_to_accuracy.py``: a Houlsby et al. (2019) bottleneck adapter, built and
trained by AdapterHub's own ``adapters`` package, in its own virtual environment.

``adapters`` 1.3 pins transformers 4.57, so this script runs in that environment and imports nothing of
bitfit_hf: ``time_to_accuracy.py`` hands it the recipe's own train and dev sentences (its loader, dev carve and
sample cap, in order) and the all-MiniLM-L6-v2 folder in one JSON file. The model matches the recipe's default
classifier apart from the method: the checkpoint's mean pooling (the recipe's ``--pooling_head checkpoint``), dropout
and a linear head, trained with the adapter. The adapter is ``adapters.DoubleSeqBnConfig()`` (Houlsby: one
bottleneck after attention and one after the feed-forward block, reduction factor 16, swish), added with
``adapters.init`` / ``add_adapter`` / ``train_adapter`` (which freezes the base). Training is transformers' own
``Trainer`` (AdapterHub's ``AdapterTrainer`` differs from it only in what it saves), at AdapterHub's documented rate
1e-4, with the recipe's batch, epochs, ``--seed S --data_seed S`` (the same batches in the same order) and the
same evaluation and timing cadence. It writes the recipe's file layout (``trainer_state.json``,
``all_results.json``, ``trainable_summary.json``, ``tta_memory.json``) and ``versions.json``.

    outputs/adapterhub-venv/bin/python benchmarks/adapterhub_runner.py --data data.json --output_dir OUT
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from typing import Dict, List, Optional, Sequence

ADAPTER_NAME = "tta"


def load_examples(path: str) -> Dict[str, object]:
    """The exported data: ``model`` (folder), ``max_seq_length``, and ``train`` / ``dev`` lists of
    ``{"sentence", "label"}`` (checked: a malformed file fails here, before any model loads)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    for split in ("train", "dev"):
        rows = data.get(split)
        if not rows:
            raise ValueError(f"{path}: no {split!r} examples")
        bad = [i for i, row in enumerate(rows) if not isinstance(row.get("sentence"), str) or not isinstance(row.get("label"), int)]
        if bad:
            raise ValueError(f"{path}: {split} row {bad[0]} needs a 'sentence' string and an integer 'label'")
    if not data.get("model"):
        raise ValueError(f"{path}: no 'model' folder")
    return data


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Share of predictions equal to the labels (what the recipe's ``eval_accuracy`` is)."""
    if len(predictions) != len(labels) or not labels:
        raise ValueError("accuracy needs as many predictions as labels, at least one")
    return sum(int(p) == int(t) for p, t in zip(predictions, labels)) / len(labels)


def trainable_summary(trainable: int, total: int, learning_rate: float) -> dict:
    """``trainable_summary.json`` with the recipe's keys, so the table reads both alike."""
    return {"trainable_params": trainable, "total_params": total, "trainable_fraction": trainable / total,
            "learning_rate": learning_rate}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the JSON that time_to_accuracy.py exports")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--eval_batch_size", type=int, default=64, help="the recipe's")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--max_steps", type=int, default=-1)
    parser.add_argument("--eval_steps", type=int, required=True)
    parser.add_argument("--reduction_factor", type=int, default=16, help="DoubleSeqBnConfig's default")
    args = parser.parse_args(argv)
    data = load_examples(args.data)

    import adapters
    import numpy as np
    import torch
    import transformers
    from adapters import DoubleSeqBnConfig
    from torch import nn
    from transformers import AutoModel, AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments, set_seed
    from transformers.modeling_outputs import SequenceClassifierOutput

    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(data["model"])
    encoder = AutoModel.from_pretrained(data["model"], add_pooling_layer=False)
    adapters.init(encoder)
    encoder.add_adapter(ADAPTER_NAME, config=DoubleSeqBnConfig(reduction_factor=args.reduction_factor))
    encoder.train_adapter(ADAPTER_NAME)  # freezes every base weight, activates the adapter
    num_labels = max(row["label"] for row in data["train"] + data["dev"]) + 1

    class MeanPoolClassifier(nn.Module):
        """The recipe's default classifier on this base: mean pooling over real tokens, dropout, linear head."""

        def __init__(self):
            super().__init__()
            self.encoder = encoder
            self.dropout = nn.Dropout(encoder.config.hidden_dropout_prob)
            self.classifier = nn.Linear(encoder.config.hidden_size, num_labels)
            nn.init.normal_(self.classifier.weight, std=encoder.config.initializer_range)
            nn.init.zeros_(self.classifier.bias)

        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            logits = self.classifier(self.dropout(pooled))
            loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
            return SequenceClassifierOutput(loss=loss, logits=logits)

    model = MeanPoolClassifier()

    def encode(rows):
        enc = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=data["max_seq_length"])
        return [{**{k: v[i] for k, v in enc.items()}, "labels": r["label"]} for i, r in enumerate(rows)]

    train, dev = encode(data["train"]), encode(data["dev"])

    def compute_metrics(prediction):
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        return {"accuracy": accuracy(np.argmax(logits, axis=-1).tolist(), prediction.label_ids.tolist())}

    training_args = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size, num_train_epochs=args.epochs, max_steps=args.max_steps,
        learning_rate=args.learning_rate, seed=args.seed, data_seed=args.seed, eval_strategy="steps",
        eval_steps=args.eval_steps, logging_steps=args.eval_steps, include_num_input_tokens_seen=True,
        save_strategy="no", report_to="none", disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=dev,
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=compute_metrics)
    result = trainer.train()
    os.makedirs(args.output_dir, exist_ok=True)  # the state before the final evaluation, as the recipe saves it
    trainer.state.save_to_json(os.path.join(args.output_dir, "trainer_state.json"))
    final = trainer.evaluate()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    files = {
        "all_results.json": {**result.metrics, **final, "epoch": trainer.state.epoch},
        "trainable_summary.json": trainable_summary(trainable, total, args.learning_rate),
        "versions.json": {"adapters": adapters.__version__, "transformers": transformers.__version__,
                          "torch": torch.__version__, "python": sys.version.split()[0],
                          "adapter_config": "DoubleSeqBnConfig", "reduction_factor": args.reduction_factor},
    }
    memory = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        memory.update(peak_cuda_mb=torch.cuda.max_memory_allocated() / 2**20, device=torch.cuda.get_device_name())
    files["tta_memory.json"] = memory
    for name, payload in files.items():
        with open(os.path.join(args.output_dir, name), "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
    print(json.dumps({"eval_accuracy": final["eval_accuracy"], "trainable_params": trainable, "total_params": total}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
