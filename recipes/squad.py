#!/usr/bin/env python
"""BitFit for extractive question answering (SQuAD v1.1).

    accelerate launch recipes/squad.py                                     # offline default: SQuAD v1.1 dev set
    python recipes/squad.py --train_file train-v1.1.json --validation_file dev-v1.1.json  # SQuAD JSON
    python recipes/squad.py --dataset_name rajpurkar/squad                 # from the Hub
    python recipes/squad.py --max_train_samples 2000 --max_eval_samples 500 --doc_stride 64
    python recipes/squad.py --method adapterbias                           # AdapterBias (lr 1e-4)

Contexts longer than --max_seq_length become overlapping windows (--doc_stride tokens shared); the
answer span is chosen among the --n_best_size best starts and ends of every window, at most
--max_answer_length tokens long, and scored with the official SQuAD v1.1 exact match and F1.
Input: SQuAD v1.1 JSON ({"data": [{"paragraphs": [...]}]}), csv/json/jsonl or Hub datasets with the
columns id, question, context, answers ({"text": [...], "answer_start": [...]}). Output:
eval_predictions.json (id -> answer) and eval_nbest_predictions.json; predict_* with --do_predict.
"""

import logging
import os
from dataclasses import dataclass, field

from transformers import AutoModelForQuestionAnswering, DataCollatorWithPadding, default_data_collator

from bitfit_hf.metrics.loading import load_metric
from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, loading
from bitfit_hf.recipe_kit import run as recipe
from bitfit_hf.recipe_kit.data import load_raw_datasets, sample_limit, select_samples, splits_in_use
from bitfit_hf.recipe_kit.fast_path import apply_fast_path
from bitfit_hf.recipe_kit.tasks.qa import (
    QuestionAnsweringTrainer,
    check_qa_split,
    check_window_sizes,
    constant_loss,
    make_eval_features_function,
    make_train_features_function,
    postprocess_qa_predictions,
    read_squad_native,
    write_json,
)

logger = logging.getLogger(__name__)


@dataclass
class SquadDataArguments(DataArguments):
    max_seq_length: int = field(default=384, metadata={"help": "Window length in tokens (question + context)."})
    doc_stride: int = field(default=128, metadata={"help": "Tokens shared by consecutive windows of a long context."})
    n_best_size: int = field(default=20, metadata={"help": "Best start and end positions searched per window."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer, in tokens."})
    question_column_name: str = field(default="question", metadata={"help": "The question column."})
    context_column_name: str = field(default="context", metadata={"help": "The context column."})
    answer_column_name: str = field(default="answers", metadata={"help": "The answers column."})
    id_column_name: str = field(default="id", metadata={"help": "The question-id column."})


DEFAULTS = RecipeDefaults(
    recipe="squad",
    offline_dataset="squad_dev",
    training={"per_device_train_batch_size": 16, "per_device_eval_batch_size": 32, "logging_steps": 25},
    # On the offline data: 1,000 of the 8,800 training questions, 2 epochs, 300 validation questions and
    # 256-token windows keep the default run to a few minutes on 2 CPU cores. With so few steps BitFit
    # needs a higher rate than the paper's 1e-3 to learn question-dependent spans (F1 measured: 1e-3 no
    # gain over the untrained model, 5e-3 +5, 1e-2 +7); --method full keeps its default.
    offline={"max_train_samples": 1000, "max_eval_samples": 300, "num_train_epochs": 2, "max_seq_length": 256,
             "doc_stride": 64},
    offline_learning_rates={"bitfit": 1e-2, "frozen": 1e-2},
    # BitFit starts from the converged probe of the QA head: measured to win here (recipes/README.md).
    probe_head_start=("bitfit",),
)


def main(argv=None):
    # 1. Arguments: ModelArguments, SquadDataArguments, BitFitArguments, TrainingArguments.
    parsed, method_config = recipe.start_run(SquadDataArguments, DEFAULTS, argv)
    model_args, data_args, _, training_args = parsed  # (the method arguments: already in method_config)
    question, context, answers, qid = (data_args.question_column_name, data_args.context_column_name,
                                       data_args.answer_column_name, data_args.id_column_name)

    # 2. Data: the offline SQuAD v1.1 dev set, a Hub dataset, or SQuAD JSON / csv / json / jsonl files.
    raw = load_raw_datasets(data_args, model_args, native_reader=read_squad_native)
    examples = {}
    for split, wanted in splits_in_use(raw, training_args).items():
        if not wanted:
            continue
        dataset = select_samples(raw[split], sample_limit(data_args, split), split)
        # every question answerable (v1.1), answer_start inside its context; answers optional for test
        mismatched = check_qa_split(dataset, split, question, context, answers, need_answers=split != "test")
        if mismatched:
            logger.warning("%d answers of the %s split differ from their context at answer_start (kept as given).",
                           mismatched, split)
        examples[split] = dataset

    # 3. Model and tokenizer with a span-prediction head (a fast tokenizer: offset mapping is needed).
    source = loading.resolve_model_source(model_args)
    config = loading.load_config(model_args, source, "question-answering")
    tokenizer = loading.load_tokenizer(model_args, source, need_fast=True)
    check_window_sizes(tokenizer, data_args.max_seq_length, data_args.doc_stride)
    model = loading.load_model(AutoModelForQuestionAnswering, model_args, source, config)
    loading.maybe_load_adapter(model, model_args)

    # 4. Windows: labelled spans for training; example ids and context offsets for evaluation.
    padding = "max_length" if data_args.pad_to_max_length else False
    window = (data_args.max_seq_length, data_args.doc_stride, padding)
    train_windows = make_train_features_function(tokenizer, question, context, answers, *window)
    eval_windows = make_eval_features_function(tokenizer, question, context, qid, *window)
    features = {}
    with training_args.main_process_first(desc="windowing"):
        for split, dataset in examples.items():
            features[split] = dataset.map(
                train_windows if split == "train" else eval_windows, batched=True,
                remove_columns=dataset.column_names, num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache, desc=f"Windowing {split}",
            )
            logger.info("%s: %d questions -> %d windows", split, len(dataset), len(features[split]))

    def post_process(stage_examples, stage_features, predictions, stage):
        found, nbest = postprocess_qa_predictions(
            stage_examples, stage_features, predictions, n_best_size=data_args.n_best_size,
            max_answer_length=data_args.max_answer_length, id_column=qid, context_column=context,
        )
        if stage in ("eval", "predict") and trainer.is_world_process_zero():
            os.makedirs(training_args.output_dir, exist_ok=True)
            write_json(os.path.join(training_args.output_dir, f"{stage}_predictions.json"), found)
            write_json(os.path.join(training_args.output_dir, f"{stage}_nbest_predictions.json"), nbest)
        return found, nbest

    def score(found, stage_examples):
        if answers not in stage_examples.column_names or any(not a["text"] for a in stage_examples[answers]):
            return {}  # unlabelled test questions: predictions only
        references = [{"id": str(ex[qid]), "answers": ex[answers]} for ex in stage_examples]
        predictions = [{"id": key, "prediction_text": text} for key, text in found.items()]
        return load_metric("squad").compute(predictions=predictions, references=references)  # packaged `evaluate` module

    # --fast_path: compiled step, batches padded to a few lengths (docs/speed.md)
    collator = apply_fast_path(training_args, default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(
        tokenizer, pad_to_multiple_of=recipe.pad_multiple(training_args)), data_args.max_seq_length,
        len(features["train"]) if "train" in features else None)

    # 5. A BitFitTrainer whose evaluate() turns window logits into answers and scores them.
    trainer = QuestionAnsweringTrainer(
        model=model,
        args=training_args,
        train_dataset=features.get("train"),
        eval_dataset=features.get("validation"),
        eval_examples=examples.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        post_process_function=post_process,
        compute_answer_metrics=score,
        **recipe.trainer_options(model_args, method_config),
    )
    recipe.record_run(trainer, parsed)  # the resumed checkpoint checked, then trainable_summary.json, run_args.json

    # 6. Evaluate the untrained model, train and save the adapter, evaluate again.
    recipe.train_and_evaluate(
        trainer, parsed, lambda prefix: trainer.evaluate(metric_key_prefix=prefix),
        num_train_samples=len(examples["train"]) if "train" in examples else None,
        eval_counts={"eval_samples": len(examples["validation"])} if "validation" in examples else None,
        constant_loss=constant_loss(features.get("train")),  # what a collapse sits at
    )

    # 7. Predict: predict_predictions.json (id -> answer), scored when the test questions have answers.
    if training_args.do_predict:
        metrics = trainer.predict(features["test"], examples["test"], metric_key_prefix="predict")
        recipe.save_metrics(trainer, "predict", metrics)

    # 8. The model card (README.md, with the final metrics), pushed with the adapter under --push_to_hub.
    recipe.finish_run(trainer, parsed, "question-answering")


if __name__ == "__main__":
    recipe.cli_entry(main)
