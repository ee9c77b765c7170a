"""Where the assets live on this machine, and whether this process may download them.

One place for the cache layout, so the fetcher, the status checks and the CLI agree on every path:

* ``<cache>/<name>/<file>``: a data file; ``<cache>/<name>/``: a model folder, complete only when its
  manifest (:data:`MANIFEST_NAME`, written last) is there;
* ``<cache>/.<name>.download/``: a multi-part model's verified parts while it is fetched (kept across an
  interruption so the next fetch resumes, removed once the folder is in place);
* ``<cache>/.<name>.*.part``: a folder being unpacked; renamed to ``<cache>/<name>`` when complete.
"""

from __future__ import annotations

import os
from pathlib import Path

from bitfit_hf.data.assets.specs import AssetSpec, ModelSpec

__all__ = [
    "CACHE_ENV",
    "DEFAULT_CACHE",
    "OFFLINE_ENVS",
    "MANIFEST_NAME",
    "truthy",
    "offline_mode",
    "cache_dir",
    "asset_target",
    "model_target",
    "staging_dir",
    "lock_path",
]

CACHE_ENV = "BITFIT_HF_CACHE"
DEFAULT_CACHE = Path("~/.cache/bitfit_hf/assets")
MANIFEST_NAME = ".bitfit_hf_asset.json"  # written last into a cached model folder: what it holds

#: Either one set (to 1/ON/YES/TRUE) means: download nothing, name the fetch command instead.
OFFLINE_ENVS = ("BITFIT_HF_OFFLINE", "HF_HUB_OFFLINE")


def truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def offline_mode() -> bool:
    """True when ``BITFIT_HF_OFFLINE`` or ``HF_HUB_OFFLINE`` is set: nothing is downloaded."""
    return any(truthy(os.environ.get(name)) for name in OFFLINE_ENVS)


def cache_dir() -> Path:
    """``$BITFIT_HF_CACHE`` if set, else ``~/.cache/bitfit_hf/assets`` (not created here)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def asset_target(spec: AssetSpec) -> Path:
    return cache_dir() / spec.name / spec.filename


def model_target(spec: ModelSpec) -> Path:
    return cache_dir() / spec.name


def staging_dir(spec: ModelSpec) -> Path:
    """The hidden folder a multi-part model's verified parts wait in between interrupted fetches."""
    return cache_dir() / f".{spec.name}.download"


def lock_path(spec: ModelSpec) -> Path:
    """The file whose lock one fetching process holds (another one waits, then finds the folder done)."""
    return cache_dir() / f".{spec.name}.lock"
