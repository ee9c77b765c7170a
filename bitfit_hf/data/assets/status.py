"""Whether an asset is at hand: an installed wheel, a good cached copy, a corrupt one, or nothing.

Looking never writes and never downloads; :mod:`.fetch` acts on what these functions report.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bitfit_hf.data.assets.paths import asset_target, model_target
from bitfit_hf.data.assets.specs import MODEL_ASSETS, ModelSpec, check_known, data_spec
from bitfit_hf.data.assets.verify import data_file_status, folder_status

__all__ = ["installed_model", "cached_model_status", "model_status", "asset_status", "model_folder"]


def installed_model(spec: ModelSpec) -> Path | None:
    """The model folder of an installed copy of the wheel, or None (found without importing it)."""
    if not spec.module:  # a multi-part asset: its wheels install no model folder
        return None
    try:
        found = importlib.util.find_spec(spec.module)
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        found = None
    if found is None or not found.submodule_search_locations:
        return None
    inner = spec.folder.split("/", 1)[1] if "/" in spec.folder else ""
    for location in found.submodule_search_locations:
        folder = Path(location) / inner
        if (folder / spec.check_file).is_file():
            return folder
    return None


def cached_model_status(spec: ModelSpec, verify: bool) -> str:
    """``"ok"``, ``"missing"`` or ``"corrupt"`` for the cached folder of ``spec`` (see :func:`.verify.folder_status`)."""
    return folder_status(model_target(spec), spec, verify)


def model_status(name: str, verify: bool = True) -> str:
    """``"installed"`` (the wheel is installed), else the cached copy's ``"ok"``, ``"missing"`` or ``"corrupt"``."""
    spec = MODEL_ASSETS[name]
    if installed_model(spec) is not None:
        return "installed"
    return cached_model_status(spec, verify)


def model_folder(spec: ModelSpec) -> Path:
    """Where the model is read from: the installed wheel's folder, else the cache folder (good or not)."""
    return installed_model(spec) or model_target(spec)


def asset_status(name: str, verify: bool = True) -> str:
    """``"ok"``, ``"missing"`` or ``"corrupt"`` for the cached copy of ``name``
    (models: ``"installed"`` when their wheel is installed, see :func:`model_status`).

    With ``verify=False`` only the size is compared (no hashing).
    """
    check_known(name)
    if name in MODEL_ASSETS:
        return model_status(name, verify=verify)
    spec = data_spec(name)
    return data_file_status(asset_target(spec), spec, verify)

