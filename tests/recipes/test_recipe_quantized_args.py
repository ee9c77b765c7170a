"""--load_in_4bit / --load_in_8bit / --gguf_file: what cannot work is refused before anything loads,
and the causal-LM recipe builds its targets as documented (packing, response-only loss)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from recipe_support import RECIPES, REPO, load_recipe, subprocess_env

from bitfit_hf.recipe_kit import RecipeError


@pytest.fixture
def nothing_loads(monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    for name in ("AutoModelForSequenceClassification", "AutoModelForCausalLM", "AutoConfig", "AutoTokenizer"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


@pytest.mark.parametrize("flags, message", [
    (["--load_in_4bit"], "--load_in_4bit quantizes the base with bitsandbytes, which needs a CUDA GPU"),
    (["--load_in_8bit"], "--load_in_8bit quantizes the base with bitsandbytes, which needs a CUDA GPU"),
    (["--load_in_4bit", "--load_in_8bit"], "exclude each other"),
    (["--gguf_file", "m.gguf", "--load_in_4bit"], "cannot re-quantize"),
])
def test_bad_loading_flags_fail_before_loading(flags, message, tmp_path, nothing_loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RecipeError, match=message):
        load_recipe("glue").main(["--output_dir", str(tmp_path), *flags])


def test_load_in_4bit_on_cpu_is_one_error_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    proc = subprocess.run([sys.executable, str(RECIPES / "clm.py"), "--load_in_4bit", "--output_dir", str(tmp_path)],
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: --load_in_4bit quantizes the base with bitsandbytes, which needs a CUDA GPU" in proc.stderr
    assert "Traceback" not in proc.stderr


class WordTokenizer:
    """Whitespace words -> ids, enough to check how clm.py builds examples."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [len(word) + 10 for word in text.split()]}


def test_packing_concatenates_texts_into_full_blocks():
    clm = load_recipe("clm")
    out = clm.make_text_examples(WordTokenizer(), "text", 4, packing=True)({"text": ["a bb ccc", "dddd ee", "f"]})
    # 3 + eos, 2 + eos, 1 + eos = 9 tokens -> two blocks of 4, the last token dropped
    assert out["input_ids"] == [[11, 12, 13, 0], [14, 12, 0, 11]] and out["labels"] == out["input_ids"]


def test_response_only_loss_for_prompt_response_columns():
    clm = load_recipe("clm")
    tokenize = clm.make_instruction_examples(WordTokenizer(), "prompt", "response", 16, chat=False)
    out = tokenize({"prompt": ["say hi"], "response": ["hello there"]})
    assert out["input_ids"] == [[13, 12, 15, 15, 0]]
    assert out["labels"] == [[-100, -100, 15, 15, 0]]
