"""Run in a fresh interpreter that cannot import bitfit_hf: load a stock model, apply a PEFT adapter folder
with plain ``peft``, and save its logits on the given inputs. Not a test module (no ``test_`` prefix).

    python tests/adapters/peft_check.py BASE_DIR PEFT_DIR INPUTS.safetensors OUT.safetensors [--num-labels N]

INPUTS holds ``input_ids`` / ``attention_mask`` (and ``token_type_ids``); OUT gets ``logits``.
"""

import argparse
import sys


class _NoBitFit:
    """An import hook that makes ``import bitfit_hf`` fail, as on a machine without it installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "bitfit_hf" or name.startswith("bitfit_hf."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: this check runs without bitfit-hf)")
        return None


sys.meta_path.insert(0, _NoBitFit())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("peft_dir")
    parser.add_argument("inputs")
    parser.add_argument("out")
    parser.add_argument("--num-labels", type=int, default=2)
    args = parser.parse_args()

    import peft
    import torch
    import transformers as T
    from safetensors.torch import load_file, save_file

    model = T.AutoModelForSequenceClassification.from_pretrained(args.base, num_labels=args.num_labels)
    model = peft.PeftModel.from_pretrained(model, args.peft_dir).eval()
    inputs = load_file(args.inputs)
    with torch.no_grad():
        logits = model(**inputs).logits.float().contiguous()
    save_file({"logits": logits}, args.out)
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "bitfit_hf")
    print("bitfit_hf modules loaded:", loaded)
    return 0 if not loaded else 1


if __name__ == "__main__":
    sys.exit(main())
