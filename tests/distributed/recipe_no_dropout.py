"""Run a recipe (first argument: its path) with dropout switched off in the model config, so a 2-process run
can be compared with a single-process run number for number (dropout draws differ between processes)."""

import runpy
import sys

import transformers

_orig = transformers.AutoConfig.from_pretrained.__func__


def _from_pretrained(cls, *args, **kwargs):
    out = _orig(cls, *args, **kwargs)
    config = out[0] if isinstance(out, tuple) else out
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "dropout"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    return out


transformers.AutoConfig.from_pretrained = classmethod(_from_pretrained)
recipe = sys.argv[1]
sys.argv = [recipe] + sys.argv[2:]
runpy.run_path(recipe, run_name="__main__")
