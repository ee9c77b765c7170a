"""A run writes nothing until its inputs are checked, and a failed resume blames the right thing: resuming a
checkpoint with another ``--method`` (or another selection) is refused before anything is loaded, naming both
methods, and the folder resumed from keeps every byte (``run_args.json`` and ``trainable_summary.json``
included). The trainer itself refuses the same way when used as a library."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from datasets import Dataset
from reliability_support import REPO, tiny_bert

from bitfit_hf import BitFitAdapter, BitFitConfig, BitFitTrainer
from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit import run as recipe_run
from bitfit_hf.training.checkpoints import CheckpointError
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig
from bitfit_hf.tuners.random_subset import RandUniformConfig

sys.path.insert(0, str(REPO / "tests" / "recipes"))
from recipe_support import load_recipe  # noqa: E402

REACHED = "reached the loading step"

# the recipes' --method and the config each builds
RECIPE_CONFIGS = {
    "bitfit": lambda: BitFitConfig(),
    "lora": lambda: BitFitLoraConfig(bias_terms="frozen", lora_r=8, lora_alpha=16, lora_dropout=0.1),
    "bitfit_lora": lambda: BitFitLoraConfig(lora_r=8, lora_alpha=16, lora_dropout=0.1),
    "adapterbias": lambda: AdapterBiasConfig(),
    "frozen": lambda: BitFitConfig(bias_terms="frozen"),
    "rand_uniform": lambda: RandUniformConfig(),
}


def snapshot(root):
    found = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            found[path] = (open(path, "rb").read(), os.stat(path).st_mtime_ns)
    return found


def finished_run(out, method: str, **config):
    """A run's folder with its records and ``checkpoint-2`` holding an adapter of ``method``."""
    model = tiny_bert()
    cfg = RECIPE_CONFIGS[method]()
    for key, value in config.items():
        setattr(cfg, key, value)
    apply_method(model, cfg)
    checkpoint = out / "checkpoint-2"
    BitFitAdapter.from_model(model).save_pretrained(str(checkpoint))
    (checkpoint / "trainer_state.json").write_text('{"global_step": 2}')
    (checkpoint / "checkpoint_complete.json").write_text('{"global_step": 2}')
    (out / "run_args.json").write_text('{"bitfit_args": {"method": "%s"}}' % method)
    (out / "trainable_summary.json").write_text('{"trainable_params": 1234}')


@pytest.fixture()
def stop_before_loading(monkeypatch):
    def stop(parsed, *args, **kwargs):
        raise RecipeError(REACHED)

    monkeypatch.setattr(recipe_run, "fetch_default_assets", stop)


def resume(capsys, out, *argv) -> str:
    main = load_recipe("glue").main
    with pytest.raises(SystemExit) as exit_info:
        recipe_run.cli_entry(lambda: main(["--output_dir", str(out), "--resume_from_checkpoint", "last",
                                           "--max_train_samples", "8", *argv]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("trained,asked", [("lora", "bitfit"), ("bitfit", "adapterbias"), ("bitfit", "lora"),
                                           ("bitfit_lora", "lora"), ("frozen", "bitfit"), ("adapterbias", "bitfit")])
def test_resuming_with_another_method_names_both_and_writes_nothing(capsys, tmp_path, stop_before_loading,
                                                                     trained, asked):
    out = tmp_path / "out"
    finished_run(out, trained)
    before = snapshot(tmp_path)
    line = resume(capsys, out, "--method", asked)
    assert f"was trained with --method {trained}; this run asks for --method {asked}" in line
    assert "checkpoint-2" in line
    assert snapshot(tmp_path) == before


def test_resuming_with_another_selection_names_the_flag(capsys, tmp_path, stop_before_loading):
    out = tmp_path / "out"
    finished_run(out, "bitfit")
    before = snapshot(tmp_path)
    line = resume(capsys, out, "--bias_terms", "b_q", "b_m2")
    assert "was trained with --bias_terms all; this run asks for --bias_terms b_q b_m2" in line
    out2 = tmp_path / "out2"
    finished_run(out2, "lora", lora_r=4)
    line = resume(capsys, out2, "--method", "lora")
    assert "was trained with --lora_r 4; this run asks for --lora_r 8" in line
    assert snapshot(tmp_path / "out") == {k: v for k, v in before.items() if k.startswith(str(out))}


def test_the_same_method_resumes(capsys, tmp_path, stop_before_loading):
    out = tmp_path / "out"
    finished_run(out, "lora")
    assert resume(capsys, out, "--method", "lora").endswith(REACHED)


def _dataset(n=16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (n, 10), generator=g)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 10] * n,
                              "labels": torch.randint(0, 2, (n,), generator=g).tolist()})


def _args(out, **kw):
    import transformers as T

    base = dict(max_steps=2, per_device_train_batch_size=8, save_strategy="steps", save_steps=2, report_to=[],
                use_cpu=True, disable_tqdm=True, logging_strategy="no", seed=0)
    base.update(kw)
    return T.TrainingArguments(str(out), **base)


def test_the_trainer_refuses_a_checkpoint_of_another_method_and_leaves_it(tmp_path):
    BitFitTrainer(tiny_bert().train(), _args(tmp_path / "a"), train_dataset=_dataset(),
                  method_config=RECIPE_CONFIGS["lora"]()).train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    before = snapshot(checkpoint)
    model = tiny_bert().train()
    trainer = BitFitTrainer(model, _args(tmp_path / "b", max_steps=4), train_dataset=_dataset(),
                            method_config=BitFitConfig())
    with pytest.raises(CheckpointError, match="was trained with --method lora; this run asks for --method bitfit"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert snapshot(checkpoint) == before
    assert not any(".lora_" in n for n, _ in model.named_parameters())  # the checkpoint's method was not applied


@pytest.mark.slow
def test_a_real_failed_resume_leaves_the_run_it_resumes_from_intact(capsys, tmp_path):
    """The issue's report: a real --method lora run resumed with --method bitfit (and a bitfit run with
    --method adapterbias) on all-MiniLM-L6-v2."""
    common = ["--max_train_samples", "16", "--max_eval_samples", "8", "--per_device_train_batch_size", "8",
              "--per_device_eval_batch_size", "8", "--max_steps", "2", "--save_steps", "2", "--disable_tqdm", "true",
              "--eval_before_training", "false"]
    main = load_recipe("glue").main
    for trained, asked in (("lora", "bitfit"), ("bitfit", "adapterbias")):
        out = tmp_path / trained
        main(["--output_dir", str(out), "--method", trained, *common])
        assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()
        before = snapshot(out)
        with pytest.raises(SystemExit) as exit_info:
            recipe_run.cli_entry(lambda: main(["--output_dir", str(out), "--method", asked, "--resume_from_checkpoint",
                                               "last", *common, "--max_steps", "4"]))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "Traceback" not in err, err[-3000:]
        line = [x for x in err.splitlines() if "error:" in x][-1]
        assert f"was trained with --method {trained}; this run asks for --method {asked}" in line, line
        assert "revision" not in line and "do not exist" not in line
        assert snapshot(out) == before
    # the run's own method resumes it (checkpoint-2 to step 4)
    main(["--output_dir", str(tmp_path / "lora"), "--method", "lora", "--resume_from_checkpoint", "last", *common,
          "--max_steps", "4"])
    assert (tmp_path / "lora" / "checkpoint-4" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("trained,asked,extra", [("rand_uniform", "bitfit", []), ("lora", "bitfit_lora", []),
                                                 ("bitfit", "bitfit", ["--bias_terms", "b_q"])])
def test_training_on_from_an_adapter_of_another_method_is_refused_before_loading(capsys, tmp_path, stop_before_loading,
                                                                                 trained, asked, extra):
    """--adapter_name_or_path with --do_train continues the adapter: with another method (or selection) the run
    trained a new selection on top of the loaded one and saved an adapter that lost the loaded tensors."""
    model = tiny_bert()
    apply_method(model, RECIPE_CONFIGS[trained]())
    BitFitAdapter.from_model(model).save_pretrained(str(tmp_path / "adapter"))
    main = load_recipe("glue").main
    with pytest.raises(SystemExit):
        recipe_run.cli_entry(lambda: main(["--output_dir", str(tmp_path / "out"), "--do_train", "--method", asked,
                                           "--adapter_name_or_path", str(tmp_path / "adapter"), *extra]))
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if "error:" in x][-1]
    if extra:
        assert "was trained with --bias_terms all; this run asks for --bias_terms b_q" in line
    else:
        assert f"was trained with --method {trained}; this run asks for --method {asked}" in line
    assert f"--adapter_name_or_path {str(tmp_path / 'adapter')!r}" in line
    assert not (tmp_path / "out").exists()
    # evaluating it (no training) is fine whatever --method says
    with pytest.raises(SystemExit):
        recipe_run.cli_entry(lambda: main(["--output_dir", str(tmp_path / "out"), "--do_eval", "--method", asked,
                                           "--adapter_name_or_path", str(tmp_path / "adapter")]))
    assert capsys.readouterr().err.strip().endswith(REACHED)
