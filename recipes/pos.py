#!/usr/bin/env python
"""BitFit for part-of-speech tagging (token classification with Penn Treebank tags).

    accelerate launch recipes/pos.py                                   # offline default: WSJ sample, PTB tags
    python recipes/pos.py --train_file train.pos --validation_file dev.pos   # word/TAG lines
    python recipes/pos.py --train_file train.conll --validation_file dev.conll  # CoNLL columns
    python recipes/pos.py --dataset_name <hub dataset> --label_column_name pos_tags
    python recipes/pos.py --method full                                # full fine-tuning baseline
    python recipes/pos.py --method adapterbias                         # AdapterBias (lr 1e-4)

Each word's tag goes on its first sub-token; the other sub-tokens are ignored by the loss and the
metric, so `eval_accuracy` is token accuracy over words. Input formats: `word/TAG` text (one sentence
per line, the WSJ sample's format), CoNLL-style columns (word first, tag last, blank line between
sentences), csv/json/jsonl with a list-of-words column and a list-of-tags column, and Hub datasets
(tags as strings or as a Sequence(ClassLabel)). With --do_predict, `predictions.txt` holds the test
sentences as `word/TAG` lines.
"""

import logging
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

from bitfit_hf import BitFitTrainer
from bitfit_hf.metrics.loading import load_metric
from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, loading
from bitfit_hf.recipe_kit import run as recipe
from bitfit_hf.recipe_kit.data import load_raw_datasets, sample_limit, select_samples, splits_in_use
from bitfit_hf.recipe_kit.fast_path import apply_fast_path
from bitfit_hf.recipe_kit.loading import ensure_pad_token
from bitfit_hf.recipe_kit.tasks.tagging import (
    check_tagged_split,
    constant_loss,
    make_tokenize_and_align,
    read_tagging_native,
    resolve_tag_set,
    resolve_tagging_columns,
    warn_if_constant_tags,
    word_level_predictions,
    write_tagged_predictions,
)

logger = logging.getLogger(__name__)


@dataclass
class PosDataArguments(DataArguments):
    text_column_name: Optional[str] = field(
        default=None, metadata={"help": "Column holding the list of words (default: tokens or words)."}
    )
    label_column_name: Optional[str] = field(
        default=None, metadata={"help": "Column holding the list of tags (default: pos_tags, tags, pos, xpos, upos, ...)."}
    )
    max_seq_length: Optional[int] = field(
        default=None, metadata={"help": "Longest tokenised sentence (default: the model's maximum, 512 for MiniLM)."}
    )
    label_all_tokens: bool = field(
        default=False,
        metadata={"help": "Train on every sub-token of a word (its tag repeated); evaluation always scores words."},
    )


DEFAULTS = RecipeDefaults(
    recipe="pos",
    offline_dataset="wsj_pos",
    training={"per_device_train_batch_size": 8, "per_device_eval_batch_size": 32, "logging_steps": 25},
)


def main(argv=None):
    # 1. Arguments: ModelArguments, PosDataArguments, BitFitArguments, TrainingArguments.
    parsed, method_config = recipe.start_run(PosDataArguments, DEFAULTS, argv)
    model_args, data_args, _, training_args = parsed  # (the method arguments: already in method_config)

    # 2. Data: the offline WSJ sample, a Hub dataset, or word/TAG, CoNLL, csv or json files.
    raw = load_raw_datasets(data_args, model_args, native_reader=read_tagging_native)
    needed = splits_in_use(raw, training_args)
    reference = next(split for split, wanted in needed.items() if wanted)
    text_column, label_column = resolve_tagging_columns(
        raw[reference], reference, data_args.text_column_name, data_args.label_column_name,
        need_labels=training_args.do_train or training_args.do_eval,
    )

    # 3. The tag set (ClassLabel names, the PTB tag set, or the training tags), checked on every split used.
    label_list, tags_are_ids = resolve_tag_set(raw, label_column) if label_column else (None, False)
    splits = {}
    for split, wanted in needed.items():
        if not wanted:
            continue
        dataset = select_samples(raw[split], sample_limit(data_args, split), split)
        split_text, split_label = resolve_tagging_columns(
            dataset, split, text_column, label_column if label_column in dataset.column_names else None,
            need_labels=split != "test",
        )
        check_tagged_split(dataset, split, split_text, split_label, label_list or [], tags_are_ids)
        splits[split] = dataset
    if label_list is None:  # tagging unlabelled text only: the tag set comes from the adapter
        label_list = loading.adapter_label_names(model_args, "--do_predict on untagged text")

    # 4. Model and tokenizer with a token-classification head (a fast tokenizer: word ids are needed).
    source = loading.resolve_model_source(model_args)
    config = loading.load_config(
        model_args, source, "token-classification", num_labels=len(label_list), finetuning_task="pos",
        id2label=dict(enumerate(label_list)), label2id={tag: i for i, tag in enumerate(label_list)},
    )
    tokenizer = loading.load_tokenizer(model_args, source, need_fast=True)
    model = loading.load_model(AutoModelForTokenClassification, model_args, source, config)
    ensure_pad_token(tokenizer, model)  # decoder-only bases (LLaMA, SmolLM2) may have no padding token
    loading.maybe_load_adapter(model, model_args)

    # 5. Tokenise pre-split words; each word's tag on its first sub-token, -100 elsewhere.
    max_seq_length = min(data_args.max_seq_length or tokenizer.model_max_length, tokenizer.model_max_length)
    padding = "max_length" if data_args.pad_to_max_length else False
    label_to_id = None if tags_are_ids else {tag: i for i, tag in enumerate(label_list)}
    features = {}
    with training_args.main_process_first(desc="tokenising"):
        for split, dataset in splits.items():
            has_tags = label_column in dataset.column_names
            align = make_tokenize_and_align(
                tokenizer, text_column, label_column if has_tags else None, label_to_id, max_seq_length, padding,
                label_all_tokens=data_args.label_all_tokens and split == "train",
            )
            features[split] = dataset.map(
                align, batched=True, num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenising {split}",
            )
            dropped = sum(features[split]["words_dropped"])
            if dropped:
                logger.warning("%d words of the %s split lost to truncation at %d tokens (not scored); raise "
                               "--max_seq_length.", dropped, split, max_seq_length)

    def compute_metrics(eval_pred):  # the packaged `evaluate` module, offline
        logits = eval_pred.predictions[0] if isinstance(eval_pred.predictions, tuple) else eval_pred.predictions
        predictions = np.argmax(logits, -1)
        warn_if_constant_tags(predictions, eval_pred.label_ids, label_list)  # every word one tag: the run collapsed
        return load_metric("token_accuracy").compute(predictions=predictions, references=eval_pred.label_ids)

    # --fast_path: compiled step, batches padded to a few lengths (docs/speed.md)
    collator = apply_fast_path(training_args, DataCollatorForTokenClassification(
        tokenizer, pad_to_multiple_of=recipe.pad_multiple(training_args)), max_seq_length,
        len(features["train"]) if "train" in features else None)

    # 6. BitFitTrainer: trains the selected biases and the head (everything with --method full).
    trainer = BitFitTrainer(
        model=model,
        args=training_args,
        train_dataset=features.get("train"),
        eval_dataset=features.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
        **recipe.trainer_options(model_args, method_config),
    )
    recipe.record_run(trainer, parsed)  # the resumed checkpoint checked, then trainable_summary.json, run_args.json

    # 7. Evaluate the untrained model, train and save the adapter, evaluate again.
    validation = splits.get("validation")
    recipe.train_and_evaluate(
        trainer, parsed, lambda prefix: recipe.evaluate_sets(trainer, {"": features["validation"]}, prefix=prefix),
        num_train_samples=len(features["train"]) if "train" in features else None,
        eval_counts=None if validation is None else {
            "eval_samples": len(validation), "eval_words": int(sum(len(words) for words in validation[text_column]))
        },
        constant_loss=constant_loss(features.get("train")),  # what a collapse sits at
    )

    # 8. Predict: predictions.txt in word/TAG format (plus accuracy when the test split has tags).
    if training_args.do_predict:
        test = features["test"]
        labelled = label_column in splits["test"].column_names
        if not labelled:
            trainer.compute_metrics = None  # the placeholder labels only mark first sub-tokens
        output = trainer.predict(test, metric_key_prefix="predict")
        trainer.compute_metrics = compute_metrics
        ids = word_level_predictions(np.asarray(output.predictions), np.asarray(output.label_ids))
        tags = [[label_list[i] for i in row] for row in ids]
        if trainer.is_world_process_zero():
            write_tagged_predictions(f"{training_args.output_dir}/predictions.txt", splits["test"][text_column], tags)
        metrics = dict(output.metrics) if labelled else {k: v for k, v in output.metrics.items() if "loss" not in k}
        metrics["predict_samples"] = len(test)
        recipe.save_metrics(trainer, "predict", metrics)

    # 9. The model card (README.md, with the final metrics), pushed with the adapter under --push_to_hub.
    recipe.finish_run(trainer, parsed, "token-classification")


if __name__ == "__main__":
    recipe.cli_entry(main)
