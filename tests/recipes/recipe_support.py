"""Helpers for the recipe tests (imported by basename: pytest puts this folder on sys.path)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"


@pytest.fixture(autouse=True)
def few_threads():
    """In-process recipe runs use two threads (imported by a test module, it applies to all its tests)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def load_recipe(name: str):
    """Import ``recipes/<name>.py`` as a module (the recipes are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bitfit_recipe_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_json(path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="2",
        MKL_NUM_THREADS="2",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def accelerate_launch(recipe: str, args, tmp_path: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """``accelerate launch --num_processes 1 recipes/<recipe>.py ARGS`` with its own config file, so a
    default accelerate config on the machine cannot change the launch."""
    config = tmp_path / "accelerate_single.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\nnum_processes: 1\n"
        "machine_rank: 0\nmixed_precision: 'no'\ndynamo_config: {}\nuse_cpu: false\n"
    )
    launcher = shutil.which("accelerate")
    base = [launcher] if launcher else [sys.executable, "-m", "accelerate.commands.launch"]
    cmd = [*base, "launch"] if launcher else base
    cmd += ["--config_file", str(config), "--num_processes", "1", str(RECIPES / f"{recipe}.py"), *map(str, args)]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited with {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n"
            f"--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def save_word_tokenizer(folder, vocab: dict, **special) -> None:
    """A word-level BERT-style tokenizer over ``vocab`` (its first five ids the special tokens), saved in ``folder``."""
    import transformers as T
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                              sep_token="[SEP]", mask_token="[MASK]", model_max_length=64, **special).save_pretrained(folder)


def save_tiny_bert(folder, vocab: dict) -> str:
    """A random 2-layer BERT (hidden 32) with a word-level tokenizer, saved as a checkpoint; returns the folder."""
    import transformers as T

    save_word_tokenizer(folder, vocab)
    torch.manual_seed(0)
    T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             vocab_size=len(vocab), max_position_embeddings=64)).save_pretrained(folder)
    return str(folder)
