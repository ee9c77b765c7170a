"""The recipes' GPU-path flags work with BitFitTrainer's own parameter groups, end to end on a CPU with a tiny
model (issue 27, item 2): --attn_implementation, --torch_compile, --group_by_length (transformers 5:
--train_sampling_strategy group_by_length), --optim adamw_torch_fused, --bf16 --frozen_dtype bfloat16. Which of
them pay on a GPU is for a GPU measurement to decide (benchmarks/README.md, "The GPU path")."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from recipe_support import few_threads, load_recipe, read_json, save_tiny_bert  # noqa: F401 - few_threads: autouse

from bitfit_hf import BitFitAdapter
from bitfit_hf.recipe_kit import parse_recipe_args
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.training.frozen_dtype import FrozenDtypeError
from bitfit_hf.training.optim import foreach_on_cpu

WORDS = "the a film movie was is very good bad great boring long fun dull it this and not".split()
VOCAB = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)}


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A random 2-layer BERT with a word-level tokenizer, saved as a checkpoint."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_base"), VOCAB)


def _capture(recipe):
    """The recipe's BitFitTrainer, kept for inspection after ``main`` returns."""
    seen = {}

    class Capturing(recipe.BitFitTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["trainer"] = self

    recipe.BitFitTrainer = Capturing
    return seen


@pytest.mark.slow
def test_gpu_path_flags_train_end_to_end_on_cpu(tmp_path, tiny_base):
    recipe = load_recipe("glue")
    seen = _capture(recipe)
    out = tmp_path / "run"
    recipe.main(["--model_name_or_path", tiny_base, "--output_dir", str(out), "--method", "bitfit_lora",
                 "--max_train_samples", "48", "--max_eval_samples", "16", "--max_steps", "3",
                 "--per_device_train_batch_size", "8", "--save_strategy", "no", "--disable_tqdm", "True",
                 "--eval_before_training", "false",
                 "--attn_implementation", "sdpa", "--torch_compile", "--torch_compile_backend", "aot_eager",
                 "--group_by_length", "--optim", "adamw_torch_fused", "--bf16", "--use_cpu",
                 "--frozen_dtype", "bfloat16"])
    trainer = seen["trainer"]
    model = trainer.model
    assert model.config._attn_implementation == "sdpa"
    assert trainer.args.torch_compile and trainer.args.train_sampling_strategy == "group_by_length"
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"  # the training ran the compiled model
    assert type(trainer._get_train_sampler()).__name__ == "LengthGroupedSampler"
    # --optim adamw_torch_fused reached BitFit's own groups; on CPU tensors it runs as foreach (a GPU keeps fused)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults["fused"]
    assert {len(g["params"]) for g in optimizer.param_groups} and len(optimizer.param_groups) >= 3  # bias, lora, head
    # frozen Linear weights bf16, trained tensors and optimizer state float32
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert any(p.dtype == torch.bfloat16 for p in frozen)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert all(v.dtype == torch.float32 for s in optimizer.state.values() for v in s.values() if v.dim())
    # the adapter (names of the stock model, never torch.compile's _orig_mod) reloads on a stock float32 base
    config = json.loads((out / "adapter_config.json").read_text())
    assert not any("_orig_mod" in name for name in config["adapter_parameters"])
    assert config["metadata"]["frozen_dtype"] == "bfloat16"
    adapter = BitFitAdapter.from_pretrained(str(out))
    assert all(t.dtype == torch.float32 for t in adapter.tensors.values())
    run_args = read_json(out / "run_args.json")["training_args"]
    assert run_args["frozen_dtype"] == "bfloat16" and run_args["train_sampling_strategy"] == "group_by_length"
    assert 0.0 <= read_json(out / "eval_results.json")["eval_accuracy"] <= 1.0


def _parse(*argv):
    from recipe_support import load_recipe as _load

    glue = _load("glue")
    return parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS, ["--output_dir", "/tmp/unused", *argv])


def test_recipe_flags_parse():
    parsed = _parse("--attn_implementation", "eager", "--group_by_length")
    assert parsed.model.attn_implementation == "eager"
    assert parsed.training.train_sampling_strategy == "group_by_length"
    assert parsed.training.frozen_dtype == "auto"  # the default: float32 on a CPU, bf16 on a CUDA GPU with --bf16
    assert _parse("--group_by_length", "false").training.train_sampling_strategy == "random"
    assert _parse("--group_by_length=True").training.train_sampling_strategy == "group_by_length"
    with pytest.raises(RecipeError, match="--group_by_length"):
        _parse("--group_by_length", "maybe")
    assert _parse().model.attn_implementation is None  # transformers' own choice (sdpa for BERT)


def test_group_by_length_in_an_arguments_file(tmp_path):
    """An arguments file's ``group_by_length`` key means what the flag means, and a bad value is refused alike."""
    glue = load_recipe("glue")

    def parse_file(value):
        path = tmp_path / "args.json"
        path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "group_by_length": value}))
        return parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS, [str(path)])

    assert parse_file(True).training.train_sampling_strategy == "group_by_length"
    assert parse_file("false").training.train_sampling_strategy == "random"
    with pytest.raises(RecipeError, match="--group_by_length 'maybe'"):
        parse_file("maybe")


def test_frozen_dtype_refused_before_loading(tmp_path):
    """Explicit bfloat16 without --bf16 stops the run before anything loads, with the flag to change."""
    with pytest.raises(FrozenDtypeError, match="--bf16"):
        load_recipe("glue").main(["--output_dir", str(tmp_path / "x"), "--frozen_dtype", "bfloat16", "--use_cpu"])
    assert not (tmp_path / "x" / "adapter_config.json").exists()


def test_fused_stays_fused_on_a_gpu_and_becomes_foreach_on_cpu():
    class Fake:
        def __init__(self, device):
            self.device = torch.device(device)

    kwargs = {"fused": True, "betas": (0.9, 0.999)}
    assert foreach_on_cpu(kwargs, [{"params": [Fake("cuda"), Fake("cuda")]}]) == kwargs
    assert foreach_on_cpu(kwargs, [{"params": [Fake("cpu")]}]) == {"fused": False, "foreach": True, "betas": (0.9, 0.999)}
    assert foreach_on_cpu({"foreach": None}, [{"params": [Fake("cpu")]}]) == {"foreach": None}  # --optim adamw_torch


#: What the compiled fast path may change in a trained tensor after FAST_STEPS steps at the recipes' BitFit rate on
#: the CPU (docs/speed.md states the same bound): Inductor reorders floating-point sums, and AdamW turns a
#: gradient's last bits into up to one step of ``lr`` where that gradient is near zero. Dropout is off: its masks
#: depend on the padded length and on the generator (Inductor's differs from eager's), the training does not.
FAST_STEPS = 3
FAST_ATOL = 1e-3


def _fast_run(recipe, tiny_base, out, *flags):
    seen = _capture(recipe)
    recipe.main(["--model_name_or_path", tiny_base, "--output_dir", str(out), "--do_train",
                 "--max_train_samples", "48", "--max_steps", str(FAST_STEPS), "--per_device_train_batch_size", "8",
                 "--save_strategy", "no", "--disable_tqdm", "True", "--use_cpu", "--seed", "0", *flags])
    return seen["trainer"]


@pytest.mark.slow
def test_fast_path_adapter_matches_the_eager_run(tmp_path, tiny_base):
    base = tmp_path / "base"
    T.AutoTokenizer.from_pretrained(tiny_base).save_pretrained(base)
    T.BertModel.from_pretrained(tiny_base, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save_pretrained(base)
    tiny_base = str(base)
    recipe = load_recipe("glue")
    eager = _fast_run(recipe, tiny_base, tmp_path / "eager", "--fast_path", "off")
    fast = _fast_run(recipe, tiny_base, tmp_path / "fast", "--fast_path", "on")
    assert not eager.args.torch_compile and type(eager.model_wrapped).__name__ != "OptimizedModule"
    assert fast.args.torch_compile and fast.drop_last_train_batch and not fast.args.dataloader_drop_last
    assert type(fast.model_wrapped).__name__ == "OptimizedModule"  # trained through Inductor
    assert type(fast.data_collator).__name__ == "BucketPadding" and fast.data_collator.buckets == (8, 16, 32, 64)
    a, b = BitFitAdapter.from_pretrained(str(tmp_path / "eager")), BitFitAdapter.from_pretrained(str(tmp_path / "fast"))
    assert a.config.adapter_parameters == b.config.adapter_parameters
    assert not any("_orig_mod" in name for name in b.config.adapter_parameters)
    worst = max((a.tensors[n] - b.tensors[n]).abs().max().item() for n in a.tensors)
    print(f"fast path vs eager, largest difference in a trained tensor: {worst:.2e}")
    assert worst <= FAST_ATOL, worst
    moved = max((a.tensors[n] - a.tensors[n].clone().zero_()).abs().max().item() for n in a.tensors)
    assert moved > 10 * FAST_ATOL  # the bound is small beside what training moved
