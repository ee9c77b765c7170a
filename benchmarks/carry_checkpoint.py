"""Carry a checkpoint folder to a machine that takes only small transfers, in checked pieces.

A lent GPU machine has no network and each call to it carries a few tens of MiB, so all-mpnet-base-v2 (404 MB)
cannot travel as it is. ``pack`` rounds the weight matrices (tensors of two or more dimensions, floating point)
to float16, keeps every other tensor exact (biases, LayerNorm vectors: what BitFit trains starts where it would),
bundles the folder's other files with it in one tar, compresses it with xz (``--no-xz`` to skip), and splits that into numbered parts of at most
``--part-mib``, each with its SHA-256 in ``manifest.json``. ``unpack`` checks every part and the whole against
the manifest, joins them, and writes the folder back with the matrices widened to the dtype they had, so the
model loads as before. ``check`` says which parts are missing or damaged without writing anything.

    python benchmarks/carry_checkpoint.py pack ~/.cache/bitfit_hf/assets/mpnet gpu_carry/mpnet --part-mib 50
    # carry gpu_carry/mpnet/part-000 ... one or more per call, with manifest.json, then there:
    python benchmarks/carry_checkpoint.py unpack gpu_carry/mpnet /tmp/mpnet-fp16

Rounding is deterministic, so the same folder packs to the same parts on every machine (the study's cells name
the unpacked folder, ``/tmp/mpnet-fp16``, as their base). The unpacked folder is written beside its
destination and renamed into place only once complete, so an interrupted unpack leaves nothing half-written.
On the far machine the checkout is on ``PYTHONPATH`` (gpu_finish_study.sh sets it), so the project's helpers load there.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
from typing import Dict, List, Optional

import torch
from safetensors.torch import load_file, save

from bitfit_hf.utils.io import write_bytes_atomic

WEIGHTS = "model.safetensors"
MANIFEST = "manifest.json"
FORMAT = "bitfit-hf carry 1"


class CarryError(Exception):
    """A folder, part or manifest that cannot be packed or unpacked as asked; the message says how to fix it."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rounded_weights(path: str) -> tuple[bytes, Dict[str, str]]:
    """The checkpoint's tensors as safetensors bytes, float matrices in float16; and each rounded tensor's dtype."""
    tensors = load_file(path)
    widened: Dict[str, str] = {}
    out = {}
    for name, tensor in tensors.items():
        if tensor.dim() >= 2 and tensor.is_floating_point() and tensor.dtype != torch.float16:
            widened[name] = str(tensor.dtype).removeprefix("torch.")
            tensor = tensor.to(torch.float16)
        out[name] = tensor.contiguous()
    return save(out), widened


def bundle(folder: str, weights: bytes) -> bytes:
    """One tar of the folder's files (sorted, fixed metadata, so the same folder gives the same bytes). Hidden files
    at the top stay behind: an asset's manifest would no longer match the rounded weights."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))

        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for file in sorted(files):
                full = os.path.join(root, file)
                name = os.path.relpath(full, folder).replace(os.sep, "/")
                if name == WEIGHTS:
                    add(name, weights)
                elif not name.startswith("."):
                    with open(full, "rb") as handle:
                        add(name, handle.read())
    return buffer.getvalue()


def pack(folder: str, out: str, part_mib: float, compress: bool = True) -> dict:
    """Write ``out/part-NNN`` and ``out/manifest.json``; returns the manifest. A folder without a top-level
    ``model.safetensors`` (data files, say) travels exactly as it is."""
    folder = os.path.expanduser(folder)
    if not os.path.isdir(folder) or not os.listdir(folder):
        raise CarryError(f"{folder}: not a folder with files in it; give a checkpoint folder, e.g. "
                         "~/.cache/bitfit_hf/assets/mpnet after `bitfit-hf assets fetch mpnet`.")
    weights_path = os.path.join(folder, WEIGHTS)
    if part_mib <= 0:
        raise CarryError(f"--part-mib {part_mib}: give a positive size in MiB (what one transfer takes, less margin).")
    if os.path.isdir(out) and os.listdir(out):
        raise CarryError(f"{out} already holds files; give an empty or new folder (parts of two packs must not mix).")
    weights, widened = rounded_weights(weights_path) if os.path.isfile(weights_path) else (b"", {})
    whole = bundle(folder, weights)
    if compress:
        whole = lzma.compress(whole, preset=1)  # fast; float16 matrices gain little from more
    size = max(1, int(part_mib * 1024 * 1024))
    os.makedirs(out, exist_ok=True)
    parts: List[dict] = []
    for index, start in enumerate(range(0, len(whole), size)):
        piece = whole[start:start + size]
        name = f"part-{index:03d}"
        write_bytes_atomic(os.path.join(out, name), piece)
        parts.append({"name": name, "bytes": len(piece), "sha256": sha256(piece)})
    manifest = {"format": FORMAT, "source": os.path.abspath(folder), "bytes": len(whole), "sha256": sha256(whole),
                "compression": "xz" if compress else None, "parts": parts, "widen": widened}
    write_bytes_atomic(os.path.join(out, MANIFEST), (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifest


def read_manifest(parts_dir: str) -> dict:
    path = os.path.join(parts_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        raise CarryError(f"{path}: no manifest; carry {MANIFEST} with the parts (pack writes it beside them).") from None
    except ValueError as error:
        raise CarryError(f"{path}: not valid JSON ({error}); carry it again from the packing machine.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CarryError(f"{path}: not a manifest written by carry_checkpoint.py pack.")
    return manifest


def problems(parts_dir: str, manifest: dict) -> List[str]:
    """One line per part that is missing or does not match the manifest (empty: all present and intact)."""
    found = []
    for part in manifest["parts"]:
        path = os.path.join(parts_dir, part["name"])
        if not os.path.isfile(path):
            found.append(f"{part['name']}: missing")
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        if len(data) != part["bytes"] or sha256(data) != part["sha256"]:
            found.append(f"{part['name']}: damaged ({len(data):,} bytes, expected {part['bytes']:,} with the "
                         "manifest's SHA-256)")
    return found


def unpack(parts_dir: str, dest: str) -> str:
    """Check, join and write the folder at ``dest`` (which must not exist yet); returns ``dest``."""
    manifest = read_manifest(parts_dir)
    bad = problems(parts_dir, manifest)
    if bad:
        raise CarryError(f"{parts_dir}: " + "; ".join(bad) + ". Carry those parts again (nothing was written).")
    if os.path.exists(dest):
        raise CarryError(f"{dest} already exists; remove it or give a new destination.")
    chunks = []
    for part in manifest["parts"]:
        with open(os.path.join(parts_dir, part["name"]), "rb") as handle:
            chunks.append(handle.read())
    whole = b"".join(chunks)
    if sha256(whole) != manifest["sha256"]:
        raise CarryError(f"{parts_dir}: the joined parts do not match the manifest's whole; pack again.")
    if manifest.get("compression") == "xz":
        whole = lzma.decompress(whole)
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.", dir=parent)
    try:
        with tarfile.open(fileobj=io.BytesIO(whole), mode="r") as tar:
            tar.extractall(staging, filter="data")
        if manifest["widen"]:
            widen(os.path.join(staging, WEIGHTS), manifest["widen"])
        os.replace(staging, dest)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging)
    return dest


def size_of(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def plan(parts_dirs: List[str], call_mib: float, with_first: List[str]) -> List[List[str]]:
    """The paths each transfer carries: the manifests and ``with_first`` in the first, then every part, largest
    first, into the first transfer with room (first-fit decreasing). A part larger than a transfer is an error."""
    limit = call_mib * 1024 * 1024
    first = [os.path.join(d, MANIFEST) for d in parts_dirs] + list(with_first)
    calls: List[List[str]] = [first]
    room = [limit - sum(size_of(p) for p in first)]
    if room[0] < 0:
        raise CarryError(f"the manifests and {' '.join(with_first)} alone exceed --call-mib {call_mib:g}.")
    parts = [(os.path.join(d, p["name"]), p["bytes"]) for d in parts_dirs for p in read_manifest(d)["parts"]]
    for path, size in sorted(parts, key=lambda item: -item[1]):
        if size > limit:
            raise CarryError(f"{path} is {size / 2**20:.1f} MiB, more than --call-mib {call_mib:g}; pack with a "
                             "smaller --part-mib.")
        slot = next((i for i, free in enumerate(room) if free >= size), None)
        if slot is None:
            calls.append([])
            room.append(limit)
            slot = len(calls) - 1
        calls[slot].append(path)
        room[slot] -= size
    return calls


def widen(path: str, dtypes: Dict[str, str]) -> None:
    """Give the rounded tensors back the dtype they had, so the folder loads as the original did."""
    tensors = load_file(path)
    for name, dtype in dtypes.items():
        tensors[name] = tensors[name].to(getattr(torch, dtype))
    write_bytes_atomic(path, save(tensors))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    packer = verbs.add_parser("pack", help="round, bundle and split a checkpoint folder")
    packer.add_argument("folder")
    packer.add_argument("out", help="a new folder for the parts and manifest.json")
    packer.add_argument("--part-mib", type=float, default=50.0, help="largest part, MiB (default 50)")
    unpacker = verbs.add_parser("unpack", help="check, join and write the folder back")
    unpacker.add_argument("parts", help="the folder holding manifest.json and the parts")
    unpacker.add_argument("dest", help="where the checkpoint folder goes (must not exist)")
    packer.add_argument("--no-xz", dest="compress", action="store_false", help="split the tar uncompressed")
    checker = verbs.add_parser("check", help="list missing or damaged parts; writes nothing")
    checker.add_argument("parts")
    planner = verbs.add_parser("plan", help="group the parts of one or more packs into as few transfers as fit")
    planner.add_argument("parts", nargs="+", help="folders pack wrote")
    planner.add_argument("--call-mib", type=float, default=58.0,
                         help="what one transfer may carry besides the checkout, MiB (default 58: 64 less a checkout)")
    planner.add_argument("--with-first", nargs="*", default=[], help="other paths the first transfer carries too")
    args = parser.parse_args(argv)
    try:
        if args.verb == "pack":
            manifest = pack(args.folder, args.out, args.part_mib, args.compress)
            print(f"{len(manifest['parts'])} parts, {manifest['bytes'] / 2**20:.1f} MiB in all, "
                  f"{len(manifest['widen'])} tensors rounded to float16: {args.out}")
        elif args.verb == "unpack":
            print(unpack(args.parts, args.dest))
        elif args.verb == "plan":
            for index, paths in enumerate(plan(args.parts, args.call_mib, args.with_first), start=1):
                print(f"transfer {index}: {' '.join(paths)}")
        else:
            bad = problems(args.parts, read_manifest(args.parts))
            print("\n".join(bad) if bad else "all parts present and intact")
            return 1 if bad else 0
    except CarryError as error:
        print(f"carry_checkpoint.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
