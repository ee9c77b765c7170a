"""How an asset is verified: SHA-256 of what was downloaded, and a manifest of what was unpacked.

An archive is checked against the hash recorded in :mod:`.specs` before anything is taken out of it. A
model folder gets a manifest (each file's size and SHA-256, and which published archives it came from),
written last: a folder without one, or whose files disagree with it, is never taken for a good copy.
Sizes are compared on every look (cheap); hashes when asked (``verify=True``: ``bitfit-hf assets list``,
an explicit fetch).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bitfit_hf.data.assets.errors import AssetChecksumError
from bitfit_hf.data.assets.paths import MANIFEST_NAME
from bitfit_hf.data.assets.specs import AssetSpec, ModelSpec

__all__ = [
    "CHUNK",
    "sha256_file",
    "file_matches",
    "require_sha256",
    "write_manifest",
    "folder_status",
    "data_file_status",
]

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_matches(path: Path, sha256: str, size: int | None = None) -> bool:
    """``path`` is a file of ``size`` bytes (when given) hashing to ``sha256``; the size is checked first."""
    if not path.is_file():
        return False
    if size is not None and path.stat().st_size != size:
        return False
    return sha256_file(path) == sha256


def require_sha256(path: Path, expected: str, what: str, consequence: str) -> None:
    """Raise :class:`AssetChecksumError` (``what``, both hashes, ``consequence``) unless ``path`` hashes to ``expected``."""
    digest = sha256_file(path)
    if digest != expected:
        raise AssetChecksumError(f"{what} {path} has SHA-256 {digest}, expected {expected}; {consequence}")


def write_manifest(folder: Path, spec: ModelSpec, files: dict[str, list]) -> None:
    """Record what ``folder`` holds (``files``: relative path -> [size, sha256]); call it last."""
    manifest = {"requirement": spec.requirement, **spec.identity, "files": files}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def folder_status(folder: Path, spec: ModelSpec, verify: bool) -> str:
    """``"ok"``, ``"missing"`` (no manifest) or ``"corrupt"`` for a model folder unpacked from ``spec``."""
    manifest = folder / MANIFEST_NAME
    if not manifest.is_file():
        return "missing"
    try:
        record = json.loads(manifest.read_text())
        files = record["files"]
        if any(record.get(key) != value for key, value in spec.identity.items()) or spec.check_file not in files:
            return "corrupt"
        for rel, (size, sha256) in files.items():
            path = folder / rel
            if not path.is_file() or path.stat().st_size != size:
                return "corrupt"
            if verify and sha256_file(path) != sha256:
                return "corrupt"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "corrupt"
    return "ok"


def data_file_status(path: Path, spec: AssetSpec, verify: bool) -> str:
    """``"ok"``, ``"missing"`` or ``"corrupt"`` for a cached data file (size always, hash if ``verify``).

    A copy from any of the asset's sources counts: the asset's own bytes or an equivalent source's.
    """
    if not path.is_file():
        return "missing"
    accepted = spec.accepted
    size = path.stat().st_size
    if size not in {expected_size for _, expected_size in accepted}:
        return "corrupt"
    if verify and (sha256_file(path), size) not in accepted:
        return "corrupt"
    return "ok"
