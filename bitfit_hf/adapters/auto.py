"""One call from an adapter to a ready task model: build the right stock base, then apply."""

from __future__ import annotations

import os
from typing import Optional, Union

import transformers
from torch import nn

from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.adapters.task_types import LABELLED
from bitfit_hf.data.assets import named_model_or, packaged_copy_or
from bitfit_hf.utils.base_loading import loading_kwargs, remember_base_loading
from bitfit_hf.utils.errors import first_line
from bitfit_hf.utils.quiet import transformers_errors_only


class AutoBitFitModel:
    """``AutoBitFitModel.from_pretrained("me/minilm-sst2-bitfit")`` builds the base model class the
    adapter was trained with (with its label count and names), loads the base weights and applies the
    adapter."""

    @classmethod
    def from_pretrained(
        cls,
        adapter: Union[str, BitFitAdapter],
        base_model: Union[None, str, nn.Module] = None,
        revision: Optional[str] = None,
        token: Optional[str] = None,
        check_base: bool = True,
        **model_kwargs,
    ) -> nn.Module:
        """``base_model`` overrides the base recorded in the adapter (a path, a Hub id or a model). Without
        it the base is loaded as it was for training: from the recorded GGUF file, or quantized with the
        recorded quantization config (``model_kwargs`` override either)."""
        if isinstance(adapter, str):
            hub = {k: v for k, v in {"revision": revision, "token": token}.items() if v is not None}
            for key in ("cache_dir", "local_files_only"):
                if key in model_kwargs:
                    hub[key] = model_kwargs[key]
            adapter = BitFitAdapter.from_pretrained(adapter, **hub)
        if isinstance(base_model, nn.Module):
            return adapter.apply_to(base_model, check_base=check_base)
        return adapter.apply_to(cls.build_base(adapter, base_model, **model_kwargs), check_base=check_base)

    @classmethod
    def build_base(cls, adapter: BitFitAdapter, base_model: Optional[str] = None, **model_kwargs) -> nn.Module:
        """The stock base model the adapter was trained on (its class, label count and names), not yet
        adapted, loaded as it was for training (the recorded GGUF file or quantization config);
        ``base_model`` overrides the recorded base (a path or a Hub id)."""
        cfg = adapter.config
        model_cls = getattr(transformers, cfg.architecture, None)
        if model_cls is None:
            raise AdapterError(
                f"transformers {transformers.__version__} has no class {cfg.architecture!r} (the adapter's "
                "architecture): upgrade transformers, or build the model yourself and use load_adapter()."
            )
        source = os.path.expanduser(base_model) if base_model else cfg.base_model_name_or_path
        if not source:
            raise AdapterError("The adapter records no base model: pass base_model= (a path or a Hub id).")
        kwargs = dict(model_kwargs)
        _check_label_kwargs(cfg, kwargs)
        if cfg.num_labels and cfg.task_type in LABELLED:
            kwargs.setdefault("num_labels", cfg.num_labels)
            if cfg.id2label:
                kwargs.setdefault("id2label", {int(k): v for k, v in cfg.id2label.items()})
                kwargs.setdefault("label2id", {k: int(v) for k, v in (cfg.label2id or {}).items()})
        if cfg.problem_type:
            kwargs.setdefault("problem_type", cfg.problem_type)
        if cfg.head_modules:
            # A base that is itself a task checkpoint may have a head of another size; the adapter brings
            # its own head, and the fingerprint still checks every other tensor.
            kwargs.setdefault("ignore_mismatched_sizes", True)
        if base_model is None:
            if cfg.base_model_revision:
                kwargs.setdefault("revision", cfg.base_model_revision)
            for key, value in loading_kwargs(cfg.base_loading).items():  # the GGUF file, the quantizer
                kwargs.setdefault(key, value)
        if base_model is None:
            local = packaged_copy_or(source, kwargs.get("revision"))
            if local != source:  # the packaged copy is the main revision; it has no other
                kwargs.pop("revision", None)
                source = local
        else:
            source = named_model_or(source)  # base_model="mpnet": the packaged copy
        try:
            # transformers reports the base's task head as newly initialised (or resized); the adapter
            # brings its own head, so that report would only mislead. Other errors still raise.
            with transformers_errors_only(bool(cfg.head_modules)):
                model = model_cls.from_pretrained(source, **kwargs)
        except OSError as err:  # not found locally, not on the Hub, or the Hub out of reach
            raise AdapterError(
                f"Cannot load the adapter's base model {source!r}: {first_line(err)} Pass a local "
                "copy of it as base_model= (`--base-model DIR` on the command line), or put it in the Hugging "
                "Face cache (the packaged default bases: `bitfit-hf assets path minilm`, `... mpnet`)."
            ) from None
        remember_base_loading(model, kwargs.get("gguf_file"))
        return model


def _check_label_kwargs(cfg, kwargs) -> None:
    """The adapter brings its own head: a label count or label names that contradict it are an error,
    not a silently ignored argument (transformers takes the count from ``id2label``)."""
    if not cfg.num_labels or cfg.task_type not in LABELLED:
        return
    asked = kwargs.get("num_labels")
    id2label = kwargs.get("id2label")
    if asked is None and id2label is not None:
        asked = len(id2label)
    if asked is not None and int(asked) != cfg.num_labels:
        names = f" ({', '.join(str(cfg.id2label[k]) for k in sorted(cfg.id2label, key=int))})" if cfg.id2label else ""
        raise AdapterError(
            f"This adapter's head has {cfg.num_labels} labels{names}; num_labels={asked} does not fit it. Drop "
            "num_labels / id2label (the adapter brings its head and label names), or train a new adapter for "
            f"{asked} labels."
        )


#: Files that make a folder a tokenizer (the recipes save one beside the adapter).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model")


def load_tokenizer(adapter: Union[str, os.PathLike, BitFitAdapter], base_model: Optional[str] = None, **kwargs):
    """The tokenizer that goes with ``adapter``: the adapter folder's own (the recipes save it there), else
    its base's -- the packaged copy where one ships (the default bases, so this works offline), else the
    Hub. ``base_model`` names another folder or Hub id to take it from. ``kwargs`` go to
    ``AutoTokenizer.from_pretrained``."""
    if not isinstance(adapter, BitFitAdapter) and base_model is None:
        folder = os.path.expanduser(str(adapter))
        if os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, f)) for f in _TOKENIZER_FILES):
            return transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
    if base_model is not None:
        source = named_model_or(os.path.expanduser(base_model))
    else:
        cfg = (adapter if isinstance(adapter, BitFitAdapter) else BitFitAdapter.from_pretrained(adapter)).config
        if not cfg.base_model_name_or_path:
            raise AdapterError("The adapter records no base model: pass base_model= (a folder or a Hub id).")
        source = packaged_copy_or(cfg.base_model_name_or_path, cfg.base_model_revision)
    try:
        return transformers.AutoTokenizer.from_pretrained(source, **kwargs)
    except OSError as err:
        raise AdapterError(
            f"Cannot load the tokenizer of the adapter's base {source!r}: {first_line(err)} Pass a "
            "local copy as base_model= (the packaged default bases: `bitfit-hf assets path minilm`, `... mpnet`)."
        ) from None
