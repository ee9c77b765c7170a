"""Reading a few tensors of a base model's safetensors checkpoint without loading the model.

Used for the bias-change map (the pretrained biases) and the parameter count of a model card. Local
folders are read here; a Hub id goes through the remote store (cache or download). Pickled ``.bin``
checkpoints are never opened.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Optional

import torch

from bitfit_hf.adapters.remote import remote_store

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def shard_names(index_path: str) -> List[str]:
    """The shard files an index names, sorted and without repeats."""
    with open(index_path, encoding="utf-8") as handle:
        return sorted(set(json.load(handle)["weight_map"].values()))


def checkpoint_files(source: str, revision: Optional[str] = None, token: Optional[str] = None,
                     local_files_only: bool = False) -> List[str]:
    """The safetensors file(s) of ``source``: a local folder, or a Hub id (``local_files_only`` reads the
    cache only, never downloading base weights)."""
    if not os.path.isdir(source):
        return remote_store().checkpoint_files(source, revision, token, local_files_only)
    index = os.path.join(source, INDEX_NAME)
    if os.path.isfile(index):
        return [os.path.join(source, shard) for shard in shard_names(index)]
    single = os.path.join(source, SINGLE_NAME)
    if os.path.isfile(single):
        return [single]
    raise FileNotFoundError(f"{source} holds no {SINGLE_NAME} (pickled checkpoints are never opened).")


def match_key(name: str, keys: Mapping[str, object]) -> Optional[str]:
    """The checkpoint key holding the model parameter ``name``.

    The task model's names may carry a prefix the checkpoint lacks (``bert.`` on a ``BertModel``
    checkpoint) or the reverse; old ``LayerNorm.beta`` names are understood.
    """
    variants = [name]
    if name.endswith("LayerNorm.bias"):
        variants.append(name[: -len("bias")] + "beta")
    for variant in variants:
        if variant in keys:
            return variant
        parts = variant.split(".")
        for i in range(1, len(parts) - 1):  # the checkpoint lacks the task model's prefix
            if ".".join(parts[i:]) in keys:
                return ".".join(parts[i:])
        longer = [k for k in keys if k.endswith("." + variant)]  # the checkpoint has a prefix
        if len(longer) == 1:
            return longer[0]
    return None


def tensor_sizes(files: List[str]) -> Dict[str, int]:
    """Number of elements of every tensor in ``files``, read from the headers only."""
    from safetensors import safe_open

    sizes: Dict[str, int] = {}
    for path in files:
        with safe_open(path, framework="pt") as handle:
            for key in handle.keys():
                count = 1
                for dim in handle.get_slice(key).get_shape():
                    count *= dim
                sizes[key] = count
    return sizes


def read_checkpoint_biases(source: str, names: List[str], revision: Optional[str] = None, token: Optional[str] = None,
                           local_files_only: bool = False) -> Dict[str, torch.Tensor]:
    """Only the named tensors of a base checkpoint (float32, flattened); names not found are left out."""
    from safetensors import safe_open

    keys: Dict[str, str] = {}
    for path in checkpoint_files(source, revision, token, local_files_only):
        with safe_open(path, framework="pt") as handle:
            for key in handle.keys():
                keys[key] = path
    out: Dict[str, torch.Tensor] = {}
    opened: Dict[str, object] = {}
    try:
        for name in names:
            key = match_key(name, keys)
            if key is None:
                continue
            path = keys[key]
            if path not in opened:
                opened[path] = safe_open(path, framework="pt").__enter__()
            out[name] = opened[path].get_tensor(key).to(torch.float32).reshape(-1)
    finally:
        for handle in opened.values():
            handle.__exit__(None, None, None)
    return out
