"""Serve a local repo through the real third-party ``olah`` Hub mirror, offline (read side only).

``olah`` (PyPI, a self-hosted Hugging Face mirror) answers the Hub's *read* API for
repositories it finds as plain git checkouts under one of its ``mirrors-path`` folders:
``<mirrors-path>/<repo_type plural>/<namespace>/<name>`` (see ``olah/server_mirror.py``
and ``olah/mirror/repos.py``).  With ``[accessibility] offline = true`` in its TOML config
it never contacts huggingface.co.  Branches and tags are real git refs; LFS files are git
pointer files whose objects live in ``<checkout>/.git/lfs/objects/aa/bb/<sha256>``.

What works through it with ``huggingface_hub`` (checked in ``tests/test_hub_server.py``):
``list_repo_files``, ``list_repo_refs``, ``hf_hub_download`` (also at a branch, a tag or a
commit sha), ``snapshot_download``.  What does not: any write (no ``create_repo``,
``preupload`` or ``commit`` endpoint), ``repo_info()`` without a revision, and a missing
file is reported as a missing repository (``RepositoryNotFoundError``), not
``EntryNotFoundError``.  Use :mod:`tests.support.hub_server` for those.

Usage::

    with serve_with_olah({"config.json": b"{}"}, "tester/tiny") as endpoint:
        env = client_env(endpoint, hf_home=tmp_path, token=None)
        run_client("from huggingface_hub import list_repo_files; result = list_repo_files('tester/tiny')", env=env)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping

__all__ = ["olah_available", "serve_with_olah", "build_mirror_repo"]

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "bitfit-tests",
    "GIT_AUTHOR_EMAIL": "bitfit-tests@example.invalid",
    "GIT_COMMITTER_NAME": "bitfit-tests",
    "GIT_COMMITTER_EMAIL": "bitfit-tests@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
}
_PLURAL = {"model": "models", "dataset": "datasets", "space": "spaces"}
_LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


def olah_available() -> tuple[bool, str]:
    """(True, "") if olah and git are installed, else (False, reason)."""
    if importlib.util.find_spec("olah") is None:
        return False, "olah is not installed (pip install olah)"
    if shutil.which("git") is None:
        return False, "git is not on PATH"
    return True, ""


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    proc = subprocess.run(["git", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args], cwd=repo,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _read_folder(folder: Path) -> dict[str, bytes]:
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and ".git" not in rel.parts:
            files[rel.as_posix()] = path.read_bytes()
    return files


def _write_tree(repo: Path, files: Mapping[str, bytes | str], lfs_suffixes: tuple[str, ...]) -> None:
    for rel, content in files.items():
        data = content.encode() if isinstance(content, str) else bytes(content)
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if lfs_suffixes and rel.endswith(lfs_suffixes) and data:
            oid = hashlib.sha256(data).hexdigest()
            obj = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
            obj.parent.mkdir(parents=True, exist_ok=True)
            obj.write_bytes(data)
            target.write_text(_LFS_POINTER.format(oid=oid, size=len(data)))
        else:
            target.write_bytes(data)


def build_mirror_repo(
    mirrors_path: str | os.PathLike,
    repo_id: str,
    files: Mapping[str, bytes | str] | str | os.PathLike,
    *,
    repo_type: str = "model",
    branches: Mapping[str, Mapping[str, bytes | str]] | None = None,
    tags: Iterable[str] = (),
    lfs_suffixes: Iterable[str] = (),
    message: str = "initial commit",
) -> dict[str, str]:
    """Create the git checkout olah expects; returns ``{ref name: commit sha}``.

    ``files`` (a mapping or a folder) is committed on ``main``; each entry of ``branches``
    is a branch started from ``main`` with its files written on top; ``tags`` are put on
    ``main``.  Paths ending with one of ``lfs_suffixes`` are stored as git-lfs pointers.
    """
    if "/" not in repo_id:
        raise ValueError("repo_id must be 'namespace/name'")
    namespace, name = repo_id.split("/", 1)
    repo = Path(mirrors_path) / _PLURAL[repo_type] / namespace / name
    repo.mkdir(parents=True)
    if not isinstance(files, Mapping):
        files = _read_folder(Path(files))
    suffixes = tuple(lfs_suffixes)
    _git(repo, "init", "-q", "-b", "main")
    _write_tree(repo, files, suffixes)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    refs = {"main": _git(repo, "rev-parse", "HEAD")}
    for branch, overlay in (branches or {}).items():
        _git(repo, "checkout", "-q", "-b", branch, "main")
        _write_tree(repo, overlay, suffixes)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"update {branch}")
        refs[branch] = _git(repo, "rev-parse", "HEAD")
        _git(repo, "checkout", "-q", "main")
    for tag in tags:
        _git(repo, "tag", tag, "main")
        refs[tag] = refs["main"]
    return refs


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_config(path: Path, *, port: int, repos: Path, mirrors: Path) -> None:
    # TOML by hand: the values are plain paths and numbers.
    path.write_text(
        "[basic]\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        f'repos-path = "{repos.as_posix()}"\n'
        f'mirrors-path = ["{mirrors.as_posix()}"]\n'
        'mirror-scheme = "http"\n'
        f'mirror-netloc = "127.0.0.1:{port}"\n'
        f'mirror-lfs-netloc = "127.0.0.1:{port}"\n'
        "metadata-cache-ttl = 0\n"
        "\n[accessibility]\n"
        "offline = true\n"
    )


@contextmanager
def serve_with_olah(
    files: Mapping[str, bytes | str] | str | os.PathLike,
    repo_id: str,
    *,
    repo_type: str = "model",
    branches: Mapping[str, Mapping[str, bytes | str]] | None = None,
    tags: Iterable[str] = (),
    lfs_suffixes: Iterable[str] = (),
    workdir: str | os.PathLike | None = None,
    startup_timeout: float = 30.0,
) -> Iterator[str]:
    """Publish ``files`` as ``repo_id`` through an offline olah process; yields its endpoint URL.

    ``files`` is a ``{path: bytes}`` mapping or a folder.  The yielded value is a ``str``
    (``http://127.0.0.1:<port>``) that also carries ``.refs`` (``{ref name: commit sha}``
    for ``main``, each branch and each tag) and ``.workdir`` (the olah folder, with
    ``olah.out`` holding its log).  The process is stopped and, unless ``workdir`` was
    given, its folder removed on exit.
    """
    ok, reason = olah_available()
    if not ok:
        raise RuntimeError(reason)
    own_dir = workdir is None
    base = Path(tempfile.mkdtemp(prefix="olah-")) if own_dir else Path(workdir)
    base.mkdir(parents=True, exist_ok=True)
    mirrors, repos, logs = base / "mirrors", base / "repos", base / "logs"
    for d in (mirrors, repos, logs):
        d.mkdir(exist_ok=True)
    refs = build_mirror_repo(mirrors, repo_id, files, repo_type=repo_type, branches=branches, tags=tags,
                             lfs_suffixes=lfs_suffixes)
    port = _free_port()
    config = base / "olah.toml"
    _write_config(config, port=port, repos=repos, mirrors=mirrors)
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    log_file = open(base / "olah.out", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "olah.server", "--config", str(config), "--log-path", str(logs)],
        cwd=base, env=env, stdout=log_file, stderr=subprocess.STDOUT,
    )
    endpoint = _Endpoint(f"http://127.0.0.1:{port}")
    endpoint.refs = refs
    endpoint.workdir = base
    try:
        probe = f"{endpoint}/api/{_PLURAL[repo_type]}/{repo_id}/revision/main"
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"olah exited with {proc.returncode}:\n{(base / 'olah.out').read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(probe, timeout=2) as resp:  # noqa: S310 - 127.0.0.1 only
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"olah did not answer on {endpoint} within {startup_timeout}s:\n"
                                   f"{(base / 'olah.out').read_text()[-4000:]}")
            time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log_file.close()
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)


class _Endpoint(str):
    """The endpoint URL (a ``str``) with ``.refs`` ({ref: commit sha}) and ``.workdir`` attached."""

    refs: dict[str, str]
    workdir: Path
