"""The recipes' --fast_path decision and set-up (bitfit_hf/recipe_kit/fast_path.py), without training."""

from __future__ import annotations

import types

import pytest
import transformers as T

from bitfit_hf.recipe_kit import parse_recipe_args
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.recipe_kit.fast_path import (
    BREAK_EVEN_STEPS,
    BREAK_EVEN_STEPS_PER_SHAPE,
    apply_fast_path,
    choose_buckets,
    decide,
    planned_steps,
)
from bitfit_hf.training.static_shapes import BucketPadding


def _args(*argv):
    from recipe_support import load_recipe

    glue = load_recipe("glue")
    return parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS, ["--output_dir", "/tmp/unused", *argv]).training


class _Padder(T.DataCollatorWithPadding):
    def __init__(self):
        super().__init__(tokenizer=None)


def test_the_flags_parse():
    assert _args().fast_path == "auto" and _args().length_buckets is None
    assert _args("--fast_path", "on", "--length_buckets", "32,64").length_buckets == "32,64"
    with pytest.raises((RecipeError, SystemExit)):
        _args("--fast_path", "sometimes")


def test_planned_steps():
    args = _args("--per_device_train_batch_size", "32", "--num_train_epochs", "3")
    assert planned_steps(args, 3200) == 300
    assert planned_steps(_args("--max_steps", "7"), 3200) == 7
    assert planned_steps(args, None) is None


def test_auto_compiles_a_long_cuda_run_only():
    long_run = _args("--max_steps", str(BREAK_EVEN_STEPS))
    on, mode, why = decide(long_run, None, cuda=True)
    assert (on, mode) == (True, "reduce-overhead") and f"{BREAK_EVEN_STEPS} optimizer steps planned" in why
    assert decide(long_run, None, cuda=False).on is False
    assert "no CUDA device" in decide(long_run, None, cuda=False).why
    on, _, why = decide(_args("--max_steps", str(BREAK_EVEN_STEPS - 1)), None, cuda=True)
    assert not on and str(BREAK_EVEN_STEPS) in why
    assert decide(_args("--fast_path", "on"), None, cuda=False)[:2] == (True, "default")  # no CUDA graphs on a CPU
    assert decide(_args("--fast_path", "off", "--max_steps", "99999"), None, cuda=True).on is False


def test_the_break_even_grows_with_the_shapes_compiled():
    steps = 3 * BREAK_EVEN_STEPS_PER_SHAPE
    assert decide(_args("--max_steps", str(steps)), None, cuda=True, shapes=3).on
    on, _, why = decide(_args("--max_steps", str(steps)), None, cuda=True, shapes=4)
    assert not on and f"{4 * BREAK_EVEN_STEPS_PER_SHAPE} where compiling 4 shape(s)" in why


def _plain_args(**values):
    """The fields decide() reads, without TrainingArguments (whose device set-up would act on a faked WORLD_SIZE)."""
    fields = dict(fast_path="auto", torch_compile=False, torch_compile_mode=None, gradient_accumulation_steps=1,
                  deepspeed=None, fsdp=None, world_size=1, max_steps=999999)
    fields.update(values)
    return types.SimpleNamespace(**fields)


@pytest.mark.parametrize("values, env, hazard", [
    ({"gradient_accumulation_steps": 2}, {}, "gradient accumulation"),
    ({"world_size": 2}, {}, "DDP"),
    ({}, {"WORLD_SIZE": "2"}, "DDP"),
    ({"fsdp": ["full_shard"]}, {}, "FSDP"),
    ({}, {"ACCELERATE_USE_FSDP": "true"}, "FSDP"),
    ({"deepspeed": "ds.json"}, {}, "DeepSpeed"),
    ({}, {"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed"),
])
def test_auto_never_records_cuda_graphs_where_they_are_unsafe(monkeypatch, values, env, hazard):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    on, mode, why = decide(_plain_args(**values), None, cuda=True)
    assert not on and mode is None and hazard in why
    on, mode, why = decide(_plain_args(fast_path="on", **values), None, cuda=True)
    assert on and mode == "default" and hazard in why  # on: compiled, without graphs
    for name in env:
        monkeypatch.delenv(name)
    assert decide(_plain_args(), None, cuda=True)[:2] == (True, "reduce-overhead")  # the same run without it


def test_the_users_own_compile_keeps_the_users_mode(monkeypatch, caplog):
    assert decide(_args("--torch_compile", "True"), None, cuda=True)[:2] == (True, "default")  # never switched
    assert decide(_args("--torch_compile", "True", "--torch_compile_mode", "max-autotune"), None, cuda=True)[:2] == (
        True, "max-autotune")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    chosen = decide(_plain_args(fast_path="on", torch_compile_mode="reduce-overhead"), None, cuda=True)
    assert chosen.mode == "reduce-overhead" and "unsafe with DeepSpeed" in caplog.text  # asked for: kept, warned


def test_the_maximum_length_is_always_a_bucket():
    assert choose_buckets(_args("--length_buckets", "32,64"), 128) == (32, 64, 128)
    assert choose_buckets(_args("--length_buckets", "32,128"), 128) == (32, 128)
    assert choose_buckets(_args(), 128) == (16, 32, 64, 128)


def test_on_sets_the_compile_flags_and_buckets():
    args = _args("--fast_path", "on", "--use_cpu")
    collator = apply_fast_path(args, _Padder(), 128, 1000)
    assert isinstance(collator, BucketPadding) and collator.buckets == (16, 32, 64, 128)
    assert args.torch_compile and args.torch_compile_backend == "inductor" and args.drop_last_train_batch
    assert not args.dataloader_drop_last  # evaluation keeps every example
    assert args.torch_compile_mode == "default"  # CPU: no CUDA graphs to capture
    chosen = _args("--fast_path", "on", "--use_cpu", "--length_buckets", "64,32", "--torch_compile_mode", "max-autotune")
    assert apply_fast_path(chosen, _Padder(), 128, 1000).buckets == (32, 64, 128)
    assert chosen.torch_compile_mode == "max-autotune"  # the user's mode is kept
    assert apply_fast_path(_args("--fast_path", "on"), T.default_data_collator, 128, 1000) is T.default_data_collator


def test_off_changes_nothing():
    args = _args("--fast_path", "off")
    padder = _Padder()
    assert apply_fast_path(args, padder, 128, 10**6) is padder
    assert not args.torch_compile and not args.drop_last_train_batch


def test_bad_buckets_are_one_clear_error():
    with pytest.raises(RecipeError, match="--length_buckets"):
        apply_fast_path(_args("--fast_path", "on", "--length_buckets", "x"), _Padder(), 128, 10)
