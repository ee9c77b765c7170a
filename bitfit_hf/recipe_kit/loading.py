"""How the recipes load a base: from a GGUF file, or quantized with bitsandbytes (QBitFit), and with
a padding token for decoder-only models (LLaMA, SmolLM2) that have none.

Every check that can fail runs before anything is loaded, so a flag that cannot work on this machine
costs no minutes of loading first.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Dict

from bitfit_hf.recipe_kit.errors import RecipeError

logger = logging.getLogger(__name__)


def check_base_loading(model_args) -> None:
    """``--gguf_file`` / ``--load_in_4bit`` / ``--load_in_8bit``: refuse what cannot work, before loading."""
    wanted = [flag for flag in ("load_in_4bit", "load_in_8bit") if getattr(model_args, flag, False)]
    if len(wanted) == 2:
        raise RecipeError("--load_in_4bit and --load_in_8bit exclude each other: pick one.")
    if getattr(model_args, "gguf_file", None):
        if wanted:
            raise RecipeError(f"--gguf_file and --{wanted[0]} exclude each other: transformers dequantises a GGUF "
                              "file to float weights and cannot re-quantize it with bitsandbytes.")
        if importlib.util.find_spec("gguf") is None:
            raise RecipeError("--gguf_file needs the `gguf` package: pip install gguf")
    if wanted:
        import torch

        if not torch.cuda.is_available():
            raise RecipeError(f"--{wanted[0]} quantizes the base with bitsandbytes, which needs a CUDA GPU; this "
                              "machine has none. Drop the flag to train in full precision (or use --gguf_file).")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise RecipeError(f"--{wanted[0]} needs the `bitsandbytes` package: pip install bitsandbytes")


#: Task heads (and the LM head) stay unquantized (float32, like every module bitsandbytes leaves alone),
#: so they can be trained.
HEAD_MODULES = ["score", "classifier", "qa_outputs", "lm_head"]


def base_loading_kwargs(model_args) -> Dict[str, Any]:
    """The ``from_pretrained`` arguments that load the base as asked (4-bit: NF4, bf16 compute, as QLoRA)."""
    if getattr(model_args, "load_in_4bit", False):
        import torch
        from transformers import BitsAndBytesConfig

        return {"quantization_config": BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True, llm_int8_skip_modules=HEAD_MODULES)}
    if getattr(model_args, "load_in_8bit", False):
        from transformers import BitsAndBytesConfig

        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=HEAD_MODULES)}
    return {}


def ensure_pad_token(tokenizer, model=None) -> None:
    """Decoder-only models often have no padding token, and their classification heads need one to find
    each sequence's last token: use the end-of-sequence token, as transformers' examples do. Also caps a
    tokenizer that reports no length limit at the model's position count."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise RecipeError(f"{type(tokenizer).__name__} has neither a padding nor an end-of-sequence token.")
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("The tokenizer has no padding token: using its end-of-sequence token %r.", tokenizer.eos_token)
    if model is not None and getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    # A tokenizer read from a GGUF file reports no length limit (about 1e30), which overflows truncation.
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit and (tokenizer.model_max_length or 0) > limit:
        tokenizer.model_max_length = limit
