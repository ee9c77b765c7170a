"""Bias-only adapters: save, load onto a stock model, check the base.

An adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (the trained
tensors only). The config is also embedded in the safetensors header, and the weights file is the
last thing a save replaces, so the weights file alone always describes a consistent adapter: a crash
between the two renames leaves either the old or the new adapter, never a mix; a stale
``adapter_config.json`` left by such a crash is ignored on load (with a warning: a load never writes), and
the next save rewrites it.
The config records a sha256 of the tensors (``bitfit_hf.adapters.integrity``): a corrupted file is
refused with an error instead of loading wrong numbers. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from typing import Dict, Optional, Union

import torch
from torch import nn

from bitfit_hf.adapters import sparse as sparse_format
from bitfit_hf.adapters.base_check import check_same_base
from bitfit_hf.adapters.config import (
    FORMAT_VERSION,
    AdapterConfig,
    AdapterError,
    task_type_of,
)
from bitfit_hf.adapters.integrity import tensors_digest, verify_tensors
from bitfit_hf.adapters.peft_format import load_peft_beft, peft_type_of
from bitfit_hf.adapters.remote import remote_store
from bitfit_hf.tuners import apply_method, method_spec, released
from bitfit_hf.tuners.peft_layers import is_wrapped_base_tensor
from bitfit_hf.tuners.registry import method_fields
from bitfit_hf.tuners.state import get_tuner_state, trainable_state_dict, unwrap
from bitfit_hf.utils.base_loading import describe_base_loading
from bitfit_hf.utils.constants import CONFIG_NAME, SUMMARY_NAME, WEIGHTS_NAME, __version__
from bitfit_hf.utils.io import write_bytes_atomic, write_json_atomic, write_text_atomic
from bitfit_hf.utils.modes import inserted_modules_follow
from bitfit_hf.utils.sentence_pooling import PoolingConfigError, install_sentence_pooling, sentence_pooling_of

logger = logging.getLogger(__name__)

_METADATA_KEY = "bitfit_adapter_config"
_PICKLE_NAMES = ("adapter_model.bin", "pytorch_model.bin", "adapter_model.pt", "adapter_model.pkl")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class BitFitAdapter:
    """A bias-only adapter: its :class:`AdapterConfig` and its tensors (on CPU)."""

    def __init__(self, config: AdapterConfig, tensors: Dict[str, torch.Tensor]):
        self.config = config
        self.tensors = tensors

    # ---- building ------------------------------------------------------------------------------
    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        base_model_name_or_path: Optional[str] = None,
        base_model_revision: Optional[str] = None,
        metadata: Optional[dict] = None,
        tensors: Optional[Dict[str, torch.Tensor]] = None,
        release: bool = True,
    ) -> "BitFitAdapter":
        """The adapter of a model prepared with :func:`apply_bitfit` (typically after training).

        ``tensors`` lets a caller that gathered the trained tensors itself (DeepSpeed ZeRO-3) pass them.
        ``release=False`` keeps training-only tensors (a training checkpoint, which must resume exactly);
        by default the method's ``release`` hook decides what the adapter holds (AdapterBias folds its L0
        gates into ``L_alpha``).
        """
        state = get_tuner_state(model)
        if state is None:
            raise AdapterError("This model was not prepared with apply_bitfit() / BitFitTrainer: it has no adapter.")
        if state.config.is_full_finetuning:
            raise AdapterError("bias_terms='full' trains every weight: save the full model with save_pretrained().")
        inner = unwrap(model)
        tensors = tensors if tensors is not None else trainable_state_dict(inner)
        cfg = state.config
        trained = state.selection.parameter_names
        if release:
            cfg, kept = released(cfg, tensors)
            trained = [n for n in trained if n in kept or n not in tensors]  # without the tensors release dropped
            tensors = kept
        sparse = getattr(state, "sparse_indices", None) or {}
        tensors = sparse_format.pack(tensors, sparse)  # partially trained tensors: their entries only
        floating = [t for t in tensors.values() if t.is_floating_point()]
        hf_config = getattr(inner, "config", None)
        architecture = type(inner).__name__
        id2label = getattr(hf_config, "id2label", None)
        label2id = getattr(hf_config, "label2id", None)
        config = AdapterConfig(
            base_model_name_or_path=base_model_name_or_path or getattr(hf_config, "_name_or_path", "") or "",
            base_model_revision=base_model_revision,
            model_type=getattr(hf_config, "model_type", "") or "",
            architecture=architecture,
            task_type=task_type_of(architecture),
            trained_parameters=trained,
            adapter_parameters=list(tensors),
            base_fingerprint=state.fingerprint,
            bias_terms=list(cfg.bias_terms),
            patterns=list(cfg.patterns),
            train_head=cfg.train_head,
            head_modules=list(state.selection.head_modules),
            add_missing_biases=cfg.add_missing_biases,
            added_biases=dict(state.added_biases),
            method=cfg.method,
            method_config=method_fields(cfg),
            base_loading=describe_base_loading(inner),
            sentence_pooling=sentence_pooling_of(inner),
            base_sketch=dict(state.base_sketch),
            sparse_parameters=[n for n in trained if n in sparse],
            num_labels=getattr(hf_config, "num_labels", None) if task_type_of(architecture) else None,
            id2label={str(k): v for k, v in id2label.items()} if id2label else None,
            label2id={str(k): int(v) for k, v in label2id.items()} if label2id else None,
            problem_type=getattr(hf_config, "problem_type", None),
            dtype=str(floating[0].dtype).replace("torch.", "") if floating else "float32",
            library_version=__version__,
            metadata=dict(metadata or {}),
        )
        return cls(config, tensors)

    # ---- saving --------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str, dtype: Optional[Union[str, torch.dtype]] = None) -> None:
        """Write the adapter atomically; ``dtype="float16"`` halves the file (off by default).

        The config records a content hash of the tensors (checked on load) and, like every metadata
        field, never a credential.
        """
        from safetensors.torch import save

        tensors = self.tensors
        if dtype is not None:
            dtype = _DTYPES[dtype] if isinstance(dtype, str) else dtype
            tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        fields = {"format_version": FORMAT_VERSION, "tensors_sha256": tensors_digest(tensors)}
        if dtype is not None:
            fields["dtype"] = str(dtype).replace("torch.", "")
        else:  # the same tensors as in memory: keep this object's config in step with the file
            self.config.format_version, self.config.tensors_sha256 = fields["format_version"], fields["tensors_sha256"]
        config = AdapterConfig.from_dict({**self.config.to_dict(), **fields})
        os.makedirs(save_directory, exist_ok=True)
        text = config.to_json()
        # JSON first, weights (which embed the same config) last: the weights file is the commit point.
        write_text_atomic(os.path.join(save_directory, CONFIG_NAME), text)
        data = save(tensors, metadata={"format": "pt", _METADATA_KEY: text})
        write_bytes_atomic(os.path.join(save_directory, WEIGHTS_NAME), canonical_safetensors(data))

    def push_to_hub(self, repo_id: str, **kwargs):
        """Push this adapter with a generated model card to the Hub in one commit (no commit when
        nothing changed); see :func:`bitfit_hf.hub.client.push_adapter_to_hub` for ``token``, ``private``,
        ``revision``, ``commit_message``, ``model_card``, ``base_model``, ``base`` and card fields."""
        return remote_store().push_adapter_to_hub(self, repo_id, **kwargs)

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path_or_repo_id: str, **hub_kwargs) -> "BitFitAdapter":
        """Read an adapter from a local directory, or from the Hub (``revision=``, ``token=``, ...)."""
        local = os.path.expanduser(path_or_repo_id)  # "~/adapters/sst2" is a folder, never a Hub id
        looks_local = os.path.isabs(local) or path_or_repo_id.startswith((".", "~")) or os.path.exists(local)
        if os.path.isdir(local) or looks_local:
            if hub_kwargs.get("revision"):
                raise AdapterError(f"revision= applies to Hub repos; {path_or_repo_id!r} is a local directory.")
            return cls.from_directory(local)
        directory, commit = remote_store().download_adapter(path_or_repo_id, **hub_kwargs)
        adapter = cls.from_directory(directory)
        adapter.config.metadata = {**adapter.config.metadata, "resolved_repo": path_or_repo_id, "resolved_commit": commit}
        return adapter

    @classmethod
    def from_directory(cls, directory: str) -> "BitFitAdapter":
        directory = os.path.expanduser(directory)
        if not os.path.isdir(directory):
            raise AdapterError(
                f"No adapter directory at {directory!r}. Pass the output directory of a BitFit run "
                f"(it holds {CONFIG_NAME} and {WEIGHTS_NAME}) or a Hub repo id."
            )
        peft_type = peft_type_of(directory)
        if peft_type is not None:
            raise AdapterError(
                f"{directory!r} is a PEFT {peft_type} adapter, not a BitFit one. "
                + ("load_adapter(model, directory) reads it onto a stock model." if peft_type == "BEFT"
                   else "Load it with peft.PeftModel.from_pretrained.")
            )
        weights_path = os.path.join(directory, WEIGHTS_NAME)
        if not os.path.isfile(weights_path):
            pickles = [n for n in _PICKLE_NAMES if os.path.isfile(os.path.join(directory, n))]
            if pickles:
                raise AdapterError(
                    f"{directory!r} holds {pickles[0]} (a pickle) but no {WEIGHTS_NAME}. bitfit-hf loads "
                    "safetensors only and never unpickles files; re-save the adapter with bitfit-hf."
                )
            raise AdapterError(f"{directory!r} has no {WEIGHTS_NAME}: it is not a BitFit adapter directory.")
        tensors, embedded = read_safetensors(weights_path)
        config_path = os.path.join(directory, CONFIG_NAME)
        on_disk, on_disk_error = None, None
        if os.path.isfile(config_path):
            try:
                with open(config_path, encoding="utf-8") as handle:
                    on_disk = AdapterConfig.from_json(handle.read(), config_path)  # errors on bad JSON / fields
            except (AdapterError, OSError, UnicodeDecodeError) as err:
                on_disk_error = err if isinstance(err, AdapterError) else AdapterError(f"cannot read {config_path}: {err}")
        if embedded is not None:
            config = AdapterConfig.from_json(embedded, f"the config embedded in {weights_path}")
        elif on_disk is not None:
            config = on_disk
        elif on_disk_error is not None:
            raise on_disk_error
        else:
            raise AdapterError(f"{directory!r} has no {CONFIG_NAME}: it is not a BitFit adapter directory.")
        verify_tensors(config, tensors, weights_path)
        missing = [n for n in config.adapter_parameters if n not in tensors]
        extra = [n for n in tensors if n not in config.adapter_parameters]
        if missing or extra:
            raise AdapterError(
                f"{weights_path} does not hold the tensors its config lists "
                f"(missing: {missing[:5]}, unexpected: {extra[:5]}); the adapter is damaged."
            )
        if embedded is not None and (on_disk_error is not None or (on_disk is not None and on_disk.to_dict() != config.to_dict())):
            _warn_stale_config(directory, config_path, on_disk_error)
        return cls(config, tensors)

    # ---- applying ------------------------------------------------------------------------------
    def apply_to(self, model: nn.Module, check_base: bool = True) -> nn.Module:
        """Load this adapter into ``model`` (a stock base of the same architecture), in place.

        Adds the biases the adapter added, checks every key and shape and the base fingerprint, then
        copies the tensors. Returns the model, ready for inference (or further BitFit training).
        """
        inner = unwrap(model)
        cfg = self.config
        found_type = getattr(getattr(inner, "config", None), "model_type", "")
        if cfg.model_type and found_type != cfg.model_type:
            raise AdapterError(
                f"This adapter is for a {cfg.model_type!r} model ({cfg.architecture} on "
                f"{cfg.base_model_name_or_path}); the model given is a {found_type!r} ({type(inner).__name__})."
            )
        prepare_base_for(inner, cfg)  # modules the tensors live in (AdapterBias's shifts), before any check
        self._check_shapes(inner, before_prepare=True)
        state = get_tuner_state(inner)
        if state is None or state.selection.parameter_names != cfg.trained_parameters:
            state = apply_method(inner, cfg.tuner_config())
        self._check_shapes(inner, before_prepare=False)  # tensors that only the method's modules hold
        if state.selection.parameter_names != cfg.trained_parameters:
            raise AdapterError(
                f"The adapter's trained parameters do not exist in this {type(inner).__name__}: e.g. "
                f"{_first_difference(cfg.trained_parameters, state.selection.parameter_names)}. It was trained "
                f"on {cfg.architecture} ({cfg.base_model_name_or_path})."
            )
        if check_base:
            check_same_base(cfg, state, inner)  # exact fingerprint, or the same base loaded another way
        dense, sparse = sparse_format.split(self.tensors, cfg.sparse_parameters)
        drawn = getattr(state, "sparse_indices", None)
        if sparse and drawn is not None and (set(drawn) != set(sparse) or any(
                not torch.equal(drawn[n].cpu(), sparse[n][0]) for n in sparse)):
            logger.warning("The entries drawn on this machine differ from the adapter's recorded ones; "
                           "training on from here uses the recorded ones.")
            state.use_indices(inner, {n: indices for n, (indices, _) in sparse.items()})
        params = dict(inner.named_parameters())
        with torch.no_grad():
            for name, tensor in dense.items():
                params[name].copy_(tensor.to(params[name].device))
            for name, (indices, values) in sparse.items():
                sparse_format.scatter_(params[name], indices, values)
        if cfg.id2label:
            inner.config.id2label = {int(k): v for k, v in cfg.id2label.items()}
            inner.config.label2id = {k: int(v) for k, v in (cfg.label2id or {}).items()}
        if cfg.problem_type:
            inner.config.problem_type = cfg.problem_type
        return model

    def _check_shapes(self, model: nn.Module, before_prepare: bool) -> None:
        """Every tensor exists in ``model`` with its shape. Before the method prepares a stock model, the
        tensors it creates are skipped: added biases, and for methods that insert modules (LoRA) any name
        the stock model lacks (the selection check after preparing names a missing one)."""
        params = dict(model.named_parameters())
        added = {f"{m}.bias" for m in self.config.added_biases}
        spec = _method_spec_of(self.config)

        def inserted(name: str) -> bool:  # a tensor of a module the method inserts (or a peft-wrapped base layer)
            return spec.inserts_modules and (not spec.supports("tensor_role") or spec.tensor_role(name) is not None
                                             or is_wrapped_base_tensor(name))
        try:
            dense, sparse = sparse_format.split(self.tensors, self.config.sparse_parameters)
        except KeyError as err:
            raise AdapterError(f"The adapter lists {err.args[0]!r} as a sparse tensor but does not hold it; it is damaged.") from None
        for name, (indices, values) in sparse.items():
            if name not in params:
                raise AdapterError(
                    f"The adapter trains entries of {name!r}, which this {type(model).__name__} does not have: "
                    f"the adapter is for {self.config.architecture} ({self.config.base_model_name_or_path})."
                )
            problems = sparse_format.check(name, indices, values, params[name].numel())
            if problems:
                raise AdapterError(f"The adapter's sparse tensors do not fit this model: {problems[0]}.")
        for name, tensor in dense.items():
            if before_prepare and name not in params and (name in added or inserted(name)):
                continue
            if name not in params:
                raise AdapterError(
                    f"The adapter holds {name!r}, which this {type(model).__name__} does not have: the adapter "
                    f"is for {self.config.architecture} ({self.config.base_model_name_or_path})."
                )
            if tuple(params[name].shape) != tuple(tensor.shape):
                hint = ""
                if name.split(".")[0] in self.config.head_modules and self.config.num_labels:
                    hint = (
                        f" The head was trained with num_labels={self.config.num_labels}: load the base with "
                        f"num_labels={self.config.num_labels}, or use AutoBitFitModel.from_pretrained(adapter)."
                    )
                raise AdapterError(
                    f"Shape mismatch for {name}: the adapter has {tuple(tensor.shape)}, the model "
                    f"{tuple(params[name].shape)}.{hint}"
                )

    def write_summary(self, save_directory: str, summary: dict) -> None:
        write_json_atomic(os.path.join(save_directory, SUMMARY_NAME), summary)


def _method_spec_of(config: AdapterConfig):
    """The registered method of an adapter; an adapter of an unknown method is an :class:`AdapterError`."""
    try:
        return method_spec(config.method)
    except ValueError as err:
        raise AdapterError(str(err)) from None


def prepare_base_for(model: nn.Module, config: AdapterConfig) -> None:
    """Insert into a stock ``model`` the modules that hold the tensors of an adapter of ``config``'s
    method (nothing for BitFit), so the tensors have somewhere to load; and classify through the
    sentence pooling the adapter was trained with (the base's untrained pooler removed)."""
    prepare_pooling_for(model, config)
    spec = _method_spec_of(config)
    if spec.supports("prepare_base"):
        try:
            with inserted_modules_follow(model):  # the inserted modules take the model's mode
                spec.prepare_base(model, config.tuner_config())
        except ValueError as err:
            raise AdapterError(f"Cannot prepare this {type(model).__name__} for the {config.method} adapter: {err}") from None


def prepare_pooling_for(model: nn.Module, config: AdapterConfig) -> None:
    """Classify through the sentence pooling an adapter of ``config`` was trained with (the base's untrained pooler
    removed); a model already pooling another way is refused."""
    pooled = sentence_pooling_of(model)
    if config.sentence_pooling:
        try:
            install_sentence_pooling(model, config.sentence_pooling)
        except PoolingConfigError as err:
            raise AdapterError(f"This adapter classifies from {config.sentence_pooling} pooling: {err}") from None
    elif pooled:
        raise AdapterError(
            f"This adapter classifies through the model's own pooler, but this model classifies from {pooled} "
            "pooling (its pooler removed, for an adapter trained that way): load it onto a fresh base."
        )


def _warn_stale_config(directory: str, config_path: str, error: Optional[Exception]) -> None:
    """``adapter_config.json`` disagrees with the config embedded in the weights (a save interrupted between
    its two renames, or a hand edit) or cannot be read: the embedded one belongs to these weights and is
    used. A read never writes: the folder is left as it is, and the warning says how to repair it."""
    what = f"cannot be read ({error})" if error is not None else f"does not match the config embedded in {WEIGHTS_NAME}"
    if os.path.islink(config_path):  # the Hub cache: the repo's own files need the repair
        logger.warning("%s %s; using the config embedded in %s, which always belongs to these weights. The cached "
                       "file is left unchanged; re-save and push the adapter to repair the repo.",
                       config_path, what, WEIGHTS_NAME)
        return
    logger.warning(
        "%s %s (an interrupted save, or a hand edit?); using the config embedded in %s, which always belongs to "
        "these weights. The folder is left unchanged; to repair it, re-save the adapter: "
        "python -c \"from bitfit_hf import BitFitAdapter as A; A.from_pretrained(%r).save_pretrained(%r)\"",
        config_path, what, WEIGHTS_NAME, directory, directory,
    )


def read_safetensors(path: str):
    """Tensors and embedded adapter config of a safetensors file, with clear errors for bad files."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    with open(path, "rb") as handle:
        data = handle.read()
    try:
        if len(data) < 8:
            raise ValueError(f"only {len(data)} bytes")
        (header_len,) = struct.unpack("<Q", data[:8])
        if header_len > len(data) - 8:
            raise ValueError(f"the header says {header_len} bytes, the file has {len(data) - 8}")
        header = json.loads(data[8 : 8 + header_len])
        tensors = load(data)
    except (SafetensorError, ValueError, UnicodeDecodeError) as err:
        if data[:2] == b"PK" or data[:1] == b"\x80":
            raise AdapterError(
                f"{path} is a pickle / torch.save file, not safetensors. bitfit-hf never unpickles "
                "adapter files; re-save the adapter with bitfit-hf."
            ) from None
        raise AdapterError(
            f"{path} is truncated or corrupt, not a valid safetensors file ({err}): download or save the "
            "adapter again."
        ) from None
    metadata = (header.get("__metadata__") or {}) if isinstance(header, dict) else None
    embedded = metadata.get(_METADATA_KEY) if isinstance(metadata, dict) else None
    if not isinstance(metadata, dict) or not (embedded is None or isinstance(embedded, str)):
        raise AdapterError(f"{path} has a damaged header (its metadata is not a map of strings): download or save the "
                           "adapter again.")
    return tensors, embedded


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors bytes with the header's metadata keys in sorted order.

    safetensors keeps ``__metadata__`` in a hash map whose order changes from one save to the next, so
    two saves of one adapter would differ by a few header bytes (and the Hub would see a changed file).
    Only key order changes: tensors, offsets and the header length stay the same.
    """
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    ordered = {}
    if "__metadata__" in header:
        ordered["__metadata__"] = dict(sorted((header.pop("__metadata__") or {}).items()))
    ordered.update(header)
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((-len(text)) % 8)
    if len(text) != length:  # never expected: keep the bytes as they were rather than guess
        return data
    return data[:8] + text + data[8 + length :]


def _first_difference(expected, found) -> str:
    missing = [n for n in expected if n not in set(found)]
    if missing:
        return f"{missing[0]!r} is not selectable here"
    extra = [n for n in found if n not in set(expected)]
    return f"the model also selects {extra[0]!r}" if extra else "the order differs"


def load_adapter(model: nn.Module, path_or_repo_id: str, check_base: bool = True, **hub_kwargs) -> nn.Module:
    """Load a BitFit adapter (local directory or Hub id) onto an already-built stock model.

    A local PEFT BEFT adapter folder (``"peft_type": "BEFT"``) is read too, as the equivalent BitFit
    selection (:func:`bitfit_hf.adapters.peft_format.load_peft_beft`; PEFT records no base fingerprint)."""
    local = os.path.expanduser(path_or_repo_id)
    if os.path.isdir(local) and peft_type_of(local) is not None:
        return load_peft_beft(model, local)
    return BitFitAdapter.from_pretrained(path_or_repo_id, **hub_kwargs).apply_to(model, check_base=check_base)


def save_adapter(
    model: nn.Module,
    save_directory: str,
    base_model_name_or_path: Optional[str] = None,
    base_model_revision: Optional[str] = None,
    dtype=None,
    metadata: Optional[dict] = None,
) -> BitFitAdapter:
    """Save the bias-only adapter of a model prepared with :func:`apply_bitfit`."""
    adapter = BitFitAdapter.from_model(model, base_model_name_or_path, base_model_revision, metadata)
    adapter.save_pretrained(save_directory, dtype=dtype)
    return adapter
