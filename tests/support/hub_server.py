"""A Hugging Face Hub-compatible HTTP server for the test suite (offline, 127.0.0.1 only).

What it is
----------
``HubServer`` is a small in-memory implementation of the Hub endpoints that the real
``huggingface_hub`` client calls to push and pull *model* (and dataset/space) repos: repo
creation/deletion/settings, YAML validation, ``preupload``, the ndjson ``commit`` endpoint,
branches, tags, refs, the commit log, repo info, tree listing, ``paths-info``, ``resolve``
(HEAD and GET, by branch, tag, ``refs/pr/N`` or full commit sha) and the git-LFS ``batch``
API with a signed ``PUT`` upload URL and a ``verify`` step.  It runs ``uvicorn.Server`` in a
background thread on a 127.0.0.1 port that is bound *before* the server starts, so the URL
is known up front and nothing can race for the port.

Each repo keeps branches/tags pointing at commits; each commit is an immutable snapshot
``{path: Blob}`` with a parent, title, message, author and date; commit ids are 40-hex.
A new repo starts with an "initial commit" holding a ``.gitattributes`` file, like the
real Hub.  Every request's method, path, query and headers are recorded in
``server.requests`` (see :class:`RecordedRequest`) so tests can check, e.g., that a token
was never sent to the LFS storage URL; ``server.find_bytes(b"...")`` searches every
stored blob (to check that a token never leaks into uploaded files).

How client code is run against it (the choice made for this project)
--------------------------------------------------------------------
``huggingface_hub`` fixes its endpoint (``HF_ENDPOINT``), cache (``HF_HOME``), offline flag
and Xet switch at *import* time, and other tests in the same pytest process import
``transformers``/``huggingface_hub`` long before a fixture could set ``os.environ``.
Patching ``constants`` afterwards is known to leave some code paths on the public Hub.
So the client side always runs in a **fresh subprocess** whose environment is set before
the interpreter starts: :func:`client_env` builds that environment (``HF_ENDPOINT``,
``HF_HOME``, ``HF_HUB_DISABLE_XET=1``, ``HF_HUB_DISABLE_TELEMETRY=1``, ``HF_TOKEN``, no
proxies ...) and :func:`run_client` runs a snippet of Python there and returns what the
snippet put in ``result`` (JSON), or the exception it raised (class name, MRO names,
HTTP status).  The server itself lives in the test process, so its state can be inspected
directly (``server.files(repo_id)``, ``server.commits(repo_id)``, ``server.requests``).

Pytest fixtures (import them into a test module or a conftest):

* ``hub_server``          -- a started server with a token configured (user ``tester``,
                             org ``bitfit-org``); stopped after the test; fails the test in
                             teardown if a handler raised (``server.errors``).
* ``hub_server_factory``  -- ``factory(**HubServer kwargs)`` for custom options
                             (``lfs_threshold``, ``lfs_suffixes``, ``token=None`` ...).
* ``hf_home``             -- a fresh, empty ``HF_HOME`` directory for the test.
* ``hub_client``          -- ``hub_client(code, server=None, hf_home=None, **client_env kw)``
                             runs ``code`` in a subprocess wired to ``hub_server``.

Server options worth knowing:

* ``token``: if ``None`` the server is open (no auth at all, everything acts as ``user``).
  If set: requests without ``Authorization`` are anonymous (public reads only), an
  unknown bearer token is answered 401 "Invalid credentials in Authorization header"
  (client: ``HfHubHTTPError``), a valid token of another user gets 403 when writing to a
  namespace it does not own and ``RepoNotFound`` for private repos it cannot see.
* ``lfs_threshold`` (bytes, default 10 MB) and ``lfs_suffixes`` (e.g. ``(".safetensors",)``)
  decide ``uploadMode: "lfs"`` in ``preupload``; ``gitattributes_lfs=True`` additionally
  honours the ``filter=lfs`` patterns of the repo's ``.gitattributes`` like the real Hub
  (which sends ``*.safetensors``/``*.bin`` through LFS whatever their size).
* ``tree_page_size`` / ``commits_page_size`` to exercise ``Link: rel="next"`` pagination.

Client behaviours reproduced on purpose (they matter for code that pushes adapters):

* ``preupload`` returns the ``oid`` of files already on the branch (git blob sha1 for
  regular files, sha256 for LFS files); the client drops unchanged files and, if nothing
  is left, sends **no commit at all**: ``create_commit``/``upload_folder`` log "No files
  have been modified since last commit. Skipping to prevent empty commit." and return a
  ``CommitInfo`` whose ``oid`` is the *current head* of the branch (from ``repo_info``).
* A commit payload with no operation (which this client never sends) still creates a new
  commit, as the real Hub does.
* A stale ``parentCommit`` gives 412; a ``deletedFile`` for a missing path gives 404
  ``EntryNotFound`` with "A file with this name doesn't exist".
* A 401 on a repo endpoint carries ``X-Error-Code: RepoNotFound`` (over https the client
  maps any such 401 to ``RepositoryNotFoundError``; on http it only does so with the
  header), except "Invalid credentials in Authorization header".
* With Xet enabled (``HF_HUB_DISABLE_XET`` unset and ``hf_xet`` installed) an LFS upload
  asks ``/xet-write-token``; this server answers 501 with an explicit message.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping
from urllib.parse import parse_qs, unquote, urlencode

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

__all__ = [
    "DEFAULT_TOKEN",
    "OTHER_TOKEN",
    "Blob",
    "ClientResult",
    "CommitRecord",
    "HubServer",
    "RecordedRequest",
    "client_env",
    "run_client",
    "hub_server",
    "hub_server_factory",
    "hf_home",
    "hub_client",
]

DEFAULT_TOKEN = "hf_bitfitTEST0000000000000000000000owner"
OTHER_TOKEN = "hf_bitfitTEST0000000000000000000000other"
DEFAULT_USER = "tester"
OTHER_USER = "someone-else"
DEFAULT_ORG = "bitfit-org"

REPO_ROOT = Path(__file__).resolve().parents[2]

_LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"

# The patterns a new repo's .gitattributes lists on the Hub (git-lfs tracked extensions).
_LFS_PATTERNS = [
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib",
    "*.lfs.*", "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot",
    "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors",
    "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip",
    "*.zst", "*tfevents*",
]
DEFAULT_GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in _LFS_PATTERNS).encode()

_TYPE_FROM_PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REF_NAME_RE = re.compile(r"^[A-Za-z0-9._-][A-Za-z0-9._/-]{0,254}$")
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes", "on")


class Blob:
    """Immutable file content as stored in a commit (regular git blob or LFS object)."""

    __slots__ = ("data", "lfs", "size", "sha256", "git_oid", "pointer_size")

    def __init__(self, data: bytes, lfs: bool = False) -> None:
        self.data = bytes(data)
        self.lfs = bool(lfs)
        self.size = len(self.data)
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        if self.lfs:
            pointer = _LFS_POINTER.format(oid=self.sha256, size=self.size).encode()
            self.pointer_size: int | None = len(pointer)
            self.git_oid = _git_blob_oid(pointer)
        else:
            self.pointer_size = None
            self.git_oid = _git_blob_oid(self.data)

    @property
    def etag(self) -> str:
        """What the client compares: sha256 for LFS files, git sha1 for regular ones."""
        return self.sha256 if self.lfs else self.git_oid

    def __repr__(self) -> str:
        return f"Blob(size={self.size}, lfs={self.lfs}, oid={self.etag[:12]})"


@dataclass(frozen=True)
class CommitRecord:
    oid: str
    parent: str | None
    files: Mapping[str, Blob]
    title: str
    message: str
    author: str
    date: datetime


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: datetime
    gated: bool | str = False
    gated_granted: set = field(default_factory=set)
    commits: dict = field(default_factory=dict)  # oid -> CommitRecord
    branches: dict = field(default_factory=dict)  # name -> oid
    tags: dict = field(default_factory=dict)  # name -> oid
    prs: dict = field(default_factory=dict)  # number -> oid

    @property
    def namespace(self) -> str:
        return self.repo_id.split("/", 1)[0]


@dataclass
class RecordedRequest:
    method: str
    path: str  # percent-decoded path
    raw_path: str
    query: str
    headers: dict  # lower-case names
    status: int | None = None
    time: float = field(default_factory=time.time)

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: Mapping[str, str] | None = None,
                 body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})
        self.body = dict(body or {})

    def response(self) -> Response:
        headers = {"X-Error-Message": self.message.encode("ascii", "replace").decode("ascii"), **self.headers}
        if self.code is not None:
            headers["X-Error-Code"] = self.code
        return JSONResponse({"error": self.message, **self.body}, status_code=self.status, headers=headers)


_SEG = r"[^/]+"
_API = rf"^/api/(?P<rtype>models|datasets|spaces)/(?P<ns>{_SEG})/(?P<name>{_SEG})"
_WEB = rf"^/(?:(?P<rtype>datasets|spaces)/)?(?P<ns>{_SEG})/(?P<name>{_SEG})"
# (method, regex on the raw, still percent-encoded path, handler name)
_ROUTES: list[tuple[str, re.Pattern, str]] = [
    (m, re.compile(p), h)
    for m, p, h in [
        ("POST", r"^/api/repos/create$", "create_repo"),
        ("DELETE", r"^/api/repos/delete$", "delete_repo"),
        ("POST", r"^/api/validate-yaml$", "validate_yaml"),
        ("GET", r"^/api/whoami-v2$", "whoami"),
        ("GET", _API + r"$", "repo_info"),
        ("GET", _API + rf"/revision/(?P<rev>{_SEG})$", "repo_info"),
        ("PUT", _API + r"/settings$", "settings"),
        ("GET", _API + rf"/tree/(?P<rev>{_SEG})(?:/(?P<path>.*))?$", "tree"),
        ("POST", _API + rf"/paths-info/(?P<rev>{_SEG})$", "paths_info"),
        ("GET", _API + r"/refs$", "refs"),
        ("GET", _API + rf"/commits/(?P<rev>{_SEG})$", "commits"),
        ("POST", _API + rf"/preupload/(?P<rev>{_SEG})$", "preupload"),
        ("POST", _API + rf"/commit/(?P<rev>{_SEG})$", "commit"),
        ("POST", _API + rf"/branch/(?P<branch>{_SEG})$", "create_branch"),
        ("DELETE", _API + rf"/branch/(?P<branch>{_SEG})$", "delete_branch"),
        ("POST", _API + rf"/tag/(?P<rev>{_SEG})$", "create_tag"),
        ("DELETE", _API + rf"/tag/(?P<tag>{_SEG})$", "delete_tag"),
        ("GET", _API + rf"/xet-(?:write|read)-token/(?P<rev>{_SEG})$", "xet_token"),
        ("POST", _WEB + r"\.git/info/lfs/objects/batch$", "lfs_batch"),
        ("PUT", r"^/__lfs/upload/(?P<oid>[0-9a-f]{64})$", "lfs_put"),
        ("POST", r"^/__lfs/verify$", "lfs_verify"),
        ("GET", _WEB + rf"/resolve/(?P<rev>{_SEG})/(?P<path>.+)$", "resolve"),
    ]
]


class HubServer:
    """In-memory Hub-compatible server; see the module docstring.

    >>> with HubServer(token="hf_x") as hub:   # doctest: +SKIP
    ...     env = client_env(hub, hf_home=tmp_path)
    ...     run_client("from huggingface_hub import create_repo; result = create_repo('tester/a')", env=env)
    """

    def __init__(
        self,
        token: str | None = DEFAULT_TOKEN,
        *,
        user: str = DEFAULT_USER,
        orgs: Iterable[str] = (DEFAULT_ORG,),
        extra_tokens: Mapping[str, str] | None = None,
        lfs_threshold: int = 10 * 1024 * 1024,
        lfs_suffixes: Iterable[str] = (),
        gitattributes_lfs: bool = False,
        initial_gitattributes: bool = True,
        tree_page_size: int = 1000,
        commits_page_size: int = 50,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the test Hub only binds to the loopback interface")
        self.host = host
        self.port = port
        self.token = token
        self.user = user
        self.orgs = tuple(orgs)
        self.lfs_threshold = int(lfs_threshold)
        self.lfs_suffixes = tuple(lfs_suffixes)
        self.gitattributes_lfs = gitattributes_lfs
        self.initial_gitattributes = initial_gitattributes
        self.tree_page_size = int(tree_page_size)
        self.commits_page_size = int(commits_page_size)

        # token -> user name; empty means "open server" (no auth at all)
        self._tokens: dict[str, str] = {}
        if token is not None:
            self._tokens[token] = user
            self._tokens.update(extra_tokens if extra_tokens is not None else {OTHER_TOKEN: OTHER_USER})
        self._memberships: dict[str, set] = {user: set(self.orgs)}

        self._lock = threading.RLock()
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._lfs_store: dict[str, bytes] = {}
        self._lfs_tickets: dict[str, tuple[str, int]] = {}
        self._requests: list[RecordedRequest] = []
        self.errors: list[str] = []  # tracebacks of handler crashes (500s)
        self._counter = 0

        self.app = self._build_app()
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> "HubServer":
        """Start serving (again, on the same port after a :meth:`stop`; state is kept)."""
        if self.running:
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            timeout_keep_alive=5,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"hub-server-{self.port}",
                                  daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise RuntimeError(f"test Hub server did not start on {self.url}")
            time.sleep(0.01)
        self._uvicorn, self._thread, self._socket = server, thread, sock
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: the client then sees a connection error ("network down")."""
        if self._uvicorn is None:
            return
        self._uvicorn.should_exit = True
        assert self._thread is not None
        self._thread.join(timeout / 2)
        if self._thread.is_alive():
            self._uvicorn.force_exit = True
            self._thread.join(timeout / 2)
        try:
            self._socket.close()
        except OSError:
            pass
        self._uvicorn = None
        self._thread = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ inspection helpers (test side)
    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def requests_to(self, method: str | None = None, path_contains: str = "") -> list[RecordedRequest]:
        return [r for r in self.requests if (method is None or r.method == method) and path_contains in r.path]

    def _repo(self, repo_id: str, repo_type: str = "model") -> _Repo:
        with self._lock:
            try:
                return self._repos[(repo_type, repo_id)]
            except KeyError:
                raise KeyError(f"no {repo_type} repo {repo_id!r} on the test Hub") from None

    def repo_exists(self, repo_id: str, repo_type: str = "model") -> bool:
        with self._lock:
            return (repo_type, repo_id) in self._repos

    def head(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str:
        """Commit oid a branch, tag, ``refs/pr/N`` or sha points to."""
        with self._lock:
            return self._resolve(self._repo(repo_id, repo_type), revision).oid

    def commits(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[CommitRecord]:
        """Commits reachable from ``revision``, newest first."""
        with self._lock:
            repo = self._repo(repo_id, repo_type)
            return list(self._history(repo, self._resolve(repo, revision)))

    def blobs(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, Blob]:
        with self._lock:
            return dict(self._resolve(self._repo(repo_id, repo_type), revision).files)

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        return {p: b.data for p, b in self.blobs(repo_id, revision, repo_type).items()}

    def lfs_files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> set[str]:
        return {p for p, b in self.blobs(repo_id, revision, repo_type).items() if b.lfs}

    def refs(self, repo_id: str, repo_type: str = "model") -> dict[str, dict[str, str]]:
        with self._lock:
            repo = self._repo(repo_id, repo_type)
            return {"branches": dict(repo.branches), "tags": dict(repo.tags),
                    "pull_requests": {str(k): v for k, v in repo.prs.items()}}

    def find_bytes(self, needle: bytes | str) -> list[tuple[str, str, str]]:
        """Every ``(repo_id, commit_oid, path)`` whose content contains ``needle`` (plus LFS store hits)."""
        if isinstance(needle, str):
            needle = needle.encode()
        hits = []
        with self._lock:
            for (_, repo_id), repo in self._repos.items():
                for oid, commit in repo.commits.items():
                    for path, blob in commit.files.items():
                        if needle in blob.data:
                            hits.append((repo_id, oid, path))
                    if needle in (commit.title + commit.message).encode():
                        hits.append((repo_id, oid, "<commit message>"))
            for oid, data in self._lfs_store.items():
                if needle in data:
                    hits.append(("<lfs store>", oid, ""))
        return hits

    # ------------------------------------------------------------------ seeding helpers (test side)
    def create_repo(self, repo_id: str, *, repo_type: str = "model", private: bool = False,
                    files: Mapping[str, bytes | str] | None = None, lfs: Iterable[str] = (),
                    message: str = "seed") -> str:
        """Create a repo directly (no HTTP); optionally with a first commit of ``files``.

        Returns the head commit oid of ``main``.
        """
        with self._lock:
            try:
                repo = self._new_repo(repo_type, repo_id, private=private, author=repo_id.split("/")[0])
            except _HubError as err:
                raise ValueError(err.message) from None
            if files:
                self.commit_files(repo_id, files, repo_type=repo_type, lfs=lfs, message=message)
            return repo.branches["main"]

    def commit_files(self, repo_id: str, files: Mapping[str, bytes | str], *, revision: str = "main",
                     repo_type: str = "model", lfs: Iterable[str] = (), delete: Iterable[str] = (),
                     message: str = "update") -> str:
        """Commit ``files`` (overlay) to a branch directly; ``lfs`` names the paths stored as LFS."""
        lfs = set(lfs)
        with self._lock:
            repo = self._repo(repo_id, repo_type)
            if revision not in repo.branches:
                raise KeyError(f"no branch {revision!r}")
            head = repo.commits[repo.branches[revision]]
            snapshot = dict(head.files)
            for path in delete:
                snapshot.pop(path, None)
            for path, content in files.items():
                data = content.encode() if isinstance(content, str) else bytes(content)
                snapshot[path] = Blob(data, lfs=path in lfs)
                if path in lfs:
                    self._lfs_store[snapshot[path].sha256] = data
            commit = self._new_commit(repo, head.oid, snapshot, message, "", repo.namespace)
            repo.branches[revision] = commit.oid
            return commit.oid

    def set_private(self, repo_id: str, private: bool = True, repo_type: str = "model") -> None:
        with self._lock:
            self._repo(repo_id, repo_type).private = private

    def set_gated(self, repo_id: str, gated: bool | str = "auto", *, granted: Iterable[str] = (),
                  repo_type: str = "model") -> None:
        with self._lock:
            repo = self._repo(repo_id, repo_type)
            repo.gated = gated
            repo.gated_granted = set(granted)

    # ------------------------------------------------------------------ internals: state
    def _new_repo(self, repo_type: str, repo_id: str, *, private: bool, author: str) -> _Repo:
        key = (repo_type, repo_id)
        if key in self._repos:
            raise _HubError(409, f"You already created this {repo_type} repo", body={"url": self._repo_url(repo_type, repo_id)})
        now = datetime.now(timezone.utc)
        repo = _Repo(repo_type=repo_type, repo_id=repo_id, private=private, created_at=now)
        files = {".gitattributes": Blob(DEFAULT_GITATTRIBUTES)} if self.initial_gitattributes else {}
        commit = self._new_commit(repo, None, files, "initial commit", "", author)
        repo.branches["main"] = commit.oid
        self._repos[key] = repo
        return repo

    def _new_commit(self, repo: _Repo, parent: str | None, files: Mapping[str, Blob], title: str, message: str,
                    author: str) -> CommitRecord:
        self._counter += 1
        date = datetime.now(timezone.utc)
        digest = hashlib.sha1()
        for part in (repo.repo_type, repo.repo_id, parent or "", title, message, author, date.isoformat(),
                     str(self._counter), secrets.token_hex(8)):
            digest.update(part.encode() + b"\0")
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + files[path].git_oid.encode() + b"\0")
        commit = CommitRecord(oid=digest.hexdigest(), parent=parent, files=dict(files), title=title,
                              message=message, author=author, date=date)
        repo.commits[commit.oid] = commit
        return commit

    @staticmethod
    def _history(repo: _Repo, commit: CommitRecord) -> Iterator[CommitRecord]:
        current: CommitRecord | None = commit
        while current is not None:
            yield current
            current = repo.commits[current.parent] if current.parent else None

    def _resolve(self, repo: _Repo, rev: str) -> CommitRecord:
        oid = None
        if rev in repo.branches:
            oid = repo.branches[rev]
        elif rev in repo.tags:
            oid = repo.tags[rev]
        elif rev.startswith("refs/heads/") and rev[len("refs/heads/"):] in repo.branches:
            oid = repo.branches[rev[len("refs/heads/"):]]
        elif rev.startswith("refs/tags/") and rev[len("refs/tags/"):] in repo.tags:
            oid = repo.tags[rev[len("refs/tags/"):]]
        elif (m := re.fullmatch(r"refs/pr/(\d+)", rev)) and int(m.group(1)) in repo.prs:
            oid = repo.prs[int(m.group(1))]
        elif _SHA1_RE.match(rev) and rev in repo.commits:
            oid = rev
        if oid is None:
            raise _HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return repo.commits[oid]

    def _writable_ref(self, repo: _Repo, rev: str) -> tuple[str, Any]:
        name = rev[len("refs/heads/"):] if rev.startswith("refs/heads/") else rev
        if name in repo.branches:
            return ("branch", name)
        m = re.fullmatch(r"refs/pr/(\d+)", rev)
        if m and int(m.group(1)) in repo.prs:
            return ("pr", int(m.group(1)))
        if name in repo.tags or name in repo.commits:
            raise _HubError(400, f"Invalid rev id: {rev} is not a branch; commits can only be made to a branch")
        raise _HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    @staticmethod
    def _ref_head(repo: _Repo, ref: tuple[str, Any]) -> CommitRecord:
        kind, key = ref
        return repo.commits[repo.branches[key] if kind == "branch" else repo.prs[key]]

    @staticmethod
    def _move_ref(repo: _Repo, ref: tuple[str, Any], oid: str) -> None:
        kind, key = ref
        (repo.branches if kind == "branch" else repo.prs)[key] = oid

    def _repo_url(self, repo_type: str, repo_id: str) -> str:
        return f"{self.url}/{_URL_PREFIX[repo_type]}{repo_id}"

    # ------------------------------------------------------------------ internals: auth
    @property
    def _open(self) -> bool:
        return not self._tokens

    def _authenticate(self, authorization: str | None) -> str | None:
        if self._open:
            return self.user
        if authorization is None:
            return None
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip() in self._tokens:
            return self._tokens[value.strip()]
        raise _HubError(401, "Invalid credentials in Authorization header")

    def _can_write_ns(self, user: str | None, namespace: str) -> bool:
        if self._open:
            return True
        return user is not None and (namespace == user or namespace in self._memberships.get(user, set()))

    def _repo_not_found(self, user: str | None) -> _HubError:
        if user is None:
            return _HubError(401, "Repository not found", "RepoNotFound")
        return _HubError(404, "Repository not found", "RepoNotFound")

    def _readable_repo(self, params: Mapping[str, str], user: str | None) -> _Repo:
        repo_type = _TYPE_FROM_PLURAL.get(params.get("rtype") or "models", "model")
        repo_id = f"{params['ns']}/{params['name']}"
        repo = self._repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not self._can_write_ns(user, repo.namespace)):
            raise self._repo_not_found(user)
        return repo

    def _writable_repo(self, params: Mapping[str, str], user: str | None, *, api_route: bool = True) -> _Repo:
        repo = self._readable_repo(params, user)
        if not self._can_write_ns(user, repo.namespace):
            if user is None:
                # Over https the client maps any 401 on /api/{type}s/... to RepositoryNotFoundError.
                raise _HubError(401, "You must be authenticated to write to this repository",
                                "RepoNotFound" if api_route else None)
            raise _HubError(403, f"You don't have the rights to write to {repo.repo_id}")
        return repo

    # ------------------------------------------------------------------ internals: HTTP plumbing
    def _build_app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.api_route("/{full_path:path}", methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"])
        async def dispatch(request: Request, full_path: str) -> Response:  # noqa: ARG001
            return await self._dispatch(request)

        return app

    def _match(self, method: str, raw_path: str) -> tuple[str, dict[str, str]]:
        lookup = "GET" if method == "HEAD" else method
        path_matched = False
        for route_method, pattern, name in _ROUTES:
            m = pattern.match(raw_path)
            if m is None:
                continue
            path_matched = True
            if route_method == lookup:
                return name, {k: unquote(v) for k, v in m.groupdict().items() if v is not None}
        if path_matched:
            raise _HubError(405, f"Method {method} not allowed on {unquote(raw_path)}")
        raise _HubError(404, f"Not found: {unquote(raw_path)} (not implemented by the test Hub)")

    async def _dispatch(self, request: Request) -> Response:
        raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        record = RecordedRequest(
            method=request.method,
            path=unquote(raw_path),
            raw_path=raw_path,
            query=request.url.query,
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        with self._lock:
            self._requests.append(record)
        body = await request.body()
        try:
            name, params = self._match(request.method, raw_path)
            # The LFS upload URL is "pre-signed" (ticket in the query): no Authorization expected.
            user = None if name == "lfs_put" else self._authenticate(request.headers.get("authorization"))
            with self._lock:
                response = getattr(self, f"_h_{name}")(request, params, user, body)
        except _HubError as err:
            response = err.response()
        except Exception:  # noqa: BLE001 - report, don't crash the test server
            tb = traceback.format_exc()
            self.errors.append(tb)
            print(f"[test Hub] handler error for {request.method} {raw_path}:\n{tb}", file=sys.stderr)
            response = JSONResponse({"error": "test Hub internal error"}, status_code=500)
        record.status = response.status_code
        return response

    @staticmethod
    def _json(body: bytes) -> Any:
        if not body:
            return {}
        try:
            return json.loads(body)
        except ValueError as err:
            raise _HubError(400, f"Invalid JSON body: {err}") from None

    # ------------------------------------------------------------------ handlers: account / repos
    def _h_whoami(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        if user is None:
            raise _HubError(401, "Invalid username or password.")
        orgs = sorted(self._memberships.get(user, set()))
        return JSONResponse({
            "type": "user", "id": hashlib.sha1(user.encode()).hexdigest()[:24], "name": user, "fullname": user,
            "email": f"{user}@example.invalid", "emailVerified": True, "isPro": False, "canPay": False,
            "orgs": [{"type": "org", "name": o, "fullname": o, "roleInOrg": "write"} for o in orgs],
            "auth": {"type": "access_token", "accessToken": {"displayName": "bitfit-tests", "role": "write"}},
        })

    def _h_create_repo(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        payload = self._json(body)
        if user is None:
            raise _HubError(401, "Invalid username or password.")
        name = payload.get("name")
        repo_type = payload.get("type") or "model"
        if repo_type not in _URL_PREFIX:
            raise _HubError(400, f"Invalid repo type: {repo_type}")
        if not isinstance(name, str) or not _NAME_RE.match(name) or name.endswith((".git", ".")) or ".." in name:
            raise _HubError(400, f"Invalid repo name: {name!r}")
        namespace = payload.get("organization") or user
        if not self._can_write_ns(user, namespace):
            raise _HubError(403, f'You don\'t have the rights to create a {repo_type} under the namespace "{namespace}"')
        visibility = payload.get("visibility")
        private = visibility == "private" if visibility is not None else bool(payload.get("private"))
        repo_id = f"{namespace}/{name}"
        repo = self._new_repo(repo_type, repo_id, private=private, author=user)
        return JSONResponse({"url": self._repo_url(repo_type, repo_id), "name": repo_id, "id": repo.branches["main"]})

    def _h_delete_repo(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        payload = self._json(body)
        namespace = payload.get("organization") or user or ""
        repo_type = payload.get("type") or "model"
        self._writable_repo({"rtype": repo_type + "s", "ns": namespace, "name": payload.get("name", "")}, user)
        del self._repos[(repo_type, f"{namespace}/{payload.get('name')}")]
        return JSONResponse({})

    def _h_settings(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._writable_repo(params, user)
        payload = self._json(body)
        if "private" in payload:
            repo.private = bool(payload["private"])
        if "visibility" in payload:
            repo.private = payload["visibility"] == "private"
        if "gated" in payload:
            repo.gated = payload["gated"] or False
        return JSONResponse({})

    def _h_validate_yaml(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        content = self._json(body).get("content") or ""
        errors: list[dict] = []
        metadata_text = _front_matter(content)
        if metadata_text is not None:
            try:
                import yaml
            except ImportError:  # pragma: no cover - PyYAML comes with transformers
                yaml = None
            if yaml is not None:
                try:
                    data = yaml.safe_load(metadata_text)
                except yaml.YAMLError as err:
                    errors.append({"message": f"Invalid YAML in README.md metadata: {err}"})
                else:
                    if data is not None and not isinstance(data, dict):
                        errors.append({"message": "README.md metadata must be a YAML mapping"})
        status = 400 if errors else 200
        return JSONResponse({"errors": errors, "warnings": []}, status_code=status)

    def _h_xet_token(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        raise _HubError(501, "Xet storage is not available on the test Hub: run the client with HF_HUB_DISABLE_XET=1")

    # ------------------------------------------------------------------ handlers: read side
    def _h_repo_info(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._readable_repo(params, user)
        commit = self._resolve(repo, params.get("rev", "main"))
        blobs = _truthy(request.query_params.get("blobs"))
        siblings = []
        for path in sorted(commit.files):
            blob = commit.files[path]
            entry: dict[str, Any] = {"rfilename": path}
            if blobs:
                entry.update(size=blob.size, blobId=blob.git_oid)
                if blob.lfs:
                    entry["lfs"] = {"sha256": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
            siblings.append(entry)
        card = _card_data(commit.files.get("README.md"))
        info: dict[str, Any] = {
            "_id": hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}".encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.namespace,
            "sha": commit.oid,
            "lastModified": _iso(commit.date),
            "createdAt": _iso(repo.created_at),
            "private": repo.private,
            "gated": repo.gated,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": list(card.get("tags") or []) if isinstance(card.get("tags"), list) else [],
            "siblings": siblings,
            "usedStorage": sum(b.size for b in commit.files.values()),
        }
        if card:
            info["cardData"] = card
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
            for key in ("library_name", "pipeline_tag"):
                if isinstance(card.get(key), str):
                    info[key] = card[key]
        return JSONResponse(info)

    def _path_entry(self, repo: _Repo, commit: CommitRecord, path: str, expand: bool) -> dict[str, Any]:
        blob = commit.files.get(path)
        if blob is not None:
            entry: dict[str, Any] = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": path}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
        else:
            entry = {"type": "directory", "oid": _tree_oid(commit.files, path), "size": 0, "path": path}
        if expand:
            last = self._last_commit_touching(repo, commit, path)
            entry["lastCommit"] = {"id": last.oid, "title": last.title, "date": _iso(last.date)}
        return entry

    def _last_commit_touching(self, repo: _Repo, commit: CommitRecord, path: str) -> CommitRecord:
        def state(c: CommitRecord) -> Any:
            if path in c.files:
                return c.files[path].git_oid
            return _tree_oid(c.files, path)

        current = commit
        while current.parent is not None:
            parent = repo.commits[current.parent]
            if state(parent) != state(current):
                return current
            current = parent
        return current

    def _h_tree(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._readable_repo(params, user)
        commit = self._resolve(repo, params["rev"])
        base = params.get("path", "").strip("/")
        recursive = _truthy(request.query_params.get("recursive"))
        expand = _truthy(request.query_params.get("expand"))
        prefix = f"{base}/" if base else ""
        if base in commit.files:
            raise _HubError(404, f"{base} is a file, not a directory", "EntryNotFound")
        under = [p for p in commit.files if p.startswith(prefix)]
        if base and not under:
            raise _HubError(404, f"Entry not found: {base}", "EntryNotFound")
        paths: set[str] = set()
        for path in under:
            parts = path[len(prefix):].split("/")
            if recursive:
                paths.update(prefix + "/".join(parts[:i]) for i in range(1, len(parts) + 1))
            else:
                paths.add(prefix + parts[0])
        ordered = sorted(paths)
        limit = min(self.tree_page_size, 50) if expand else self.tree_page_size
        cursor = int(request.query_params.get("cursor") or 0)
        page = ordered[cursor:cursor + limit]
        headers = {}
        if cursor + limit < len(ordered):
            headers["Link"] = f'<{_with_query(request, cursor=cursor + limit)}>; rel="next"'
        return JSONResponse([self._path_entry(repo, commit, p, expand) for p in page], headers=headers)

    def _h_paths_info(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._readable_repo(params, user)
        commit = self._resolve(repo, params["rev"])
        ctype = request.headers.get("content-type", "")
        if "json" in ctype:
            payload = self._json(body)
            paths, expand = payload.get("paths") or [], bool(payload.get("expand"))
        else:
            form = parse_qs(body.decode(), keep_blank_values=True)
            paths, expand = form.get("paths", []), _truthy((form.get("expand") or ["false"])[0])
        result = []
        for raw in paths:
            path = raw.strip("/")
            if path in commit.files or any(p.startswith(path + "/") for p in commit.files):
                result.append(self._path_entry(repo, commit, path, expand))
        return JSONResponse(result)

    def _h_refs(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._readable_repo(params, user)

        def fmt(prefix: str, refs: Mapping[Any, str]) -> list[dict]:
            return [{"name": str(k), "ref": f"{prefix}{k}", "targetCommit": v} for k, v in sorted(refs.items())]

        data: dict[str, Any] = {"branches": fmt("refs/heads/", repo.branches), "tags": fmt("refs/tags/", repo.tags),
                                "converts": []}
        if _truthy(request.query_params.get("include_prs")):
            data["pullRequests"] = fmt("refs/pr/", repo.prs)
        return JSONResponse(data)

    def _h_commits(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._readable_repo(params, user)
        history = list(self._history(repo, self._resolve(repo, params["rev"])))
        limit = int(request.query_params.get("limit") or self.commits_page_size)
        page_index = int(request.query_params.get("p") or 0)
        page = history[page_index * limit:(page_index + 1) * limit]
        headers = {}
        if (page_index + 1) * limit < len(history):
            headers["Link"] = f'<{_with_query(request, p=page_index + 1, limit=limit)}>; rel="next"'
        items = [{"id": c.oid, "title": c.title, "message": c.message, "date": _iso(c.date),
                  "authors": [{"user": c.author, "avatar": None}]} for c in page]
        return JSONResponse(items, headers=headers)

    def _h_resolve(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._readable_repo(params, user)
        if repo.gated and not self._can_write_ns(user, repo.namespace) and user not in repo.gated_granted:
            raise _HubError(403, f"Access to {repo.repo_type} {repo.repo_id} is restricted. You must have access "
                                 "to it and be authenticated to access it. Please log in.", "GatedRepo")
        commit = self._resolve(repo, params["rev"])
        path = params["path"]
        blob = commit.files.get(path)
        if blob is None:
            raise _HubError(404, "Entry not found", "EntryNotFound", headers={"X-Repo-Commit": commit.oid})
        headers = {
            "X-Repo-Commit": commit.oid,
            "ETag": f'"{blob.git_oid}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if blob.lfs:
            headers["X-Linked-Etag"] = f'"{blob.sha256}"'
            headers["X-Linked-Size"] = str(blob.size)
        if request.method == "HEAD":
            headers["Content-Length"] = str(blob.size)
            return Response(status_code=200, headers=headers)
        data, status = blob.data, 200
        range_header = request.headers.get("range")
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", range_header or "")
        if m and (m.group(1) or m.group(2)):
            if m.group(1):
                start = int(m.group(1))
                end = int(m.group(2)) if m.group(2) else blob.size - 1
            else:  # suffix range: last N bytes
                start, end = max(blob.size - int(m.group(2)), 0), blob.size - 1
            end = min(end, blob.size - 1)
            if start >= blob.size or start > end:
                return Response(status_code=416, headers={"Content-Range": f"bytes */{blob.size}"})
            data, status = blob.data[start:end + 1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
        return Response(content=data, status_code=status, headers=headers)

    # ------------------------------------------------------------------ handlers: write side
    def _wants_lfs(self, path: str, size: int, head: CommitRecord) -> bool:
        if size > self.lfs_threshold:
            return True
        if self.lfs_suffixes and path.endswith(self.lfs_suffixes):
            return True
        if self.gitattributes_lfs and ".gitattributes" in head.files:
            return _matches_gitattributes_lfs(head.files[".gitattributes"].data.decode(errors="replace"), path)
        return False

    def _h_preupload(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._writable_repo(params, user)
        head = self._ref_head(repo, self._writable_ref(repo, params["rev"]))
        payload = self._json(body)
        gitignore = payload.get("gitIgnore")
        if gitignore is None and ".gitignore" in head.files:
            gitignore = head.files[".gitignore"].data.decode(errors="replace")
        result = []
        for item in payload.get("files") or []:
            path = item["path"]
            size = int(item.get("size") or 0)
            entry: dict[str, Any] = {
                "path": path,
                "uploadMode": "lfs" if self._wants_lfs(path, size, head) else "regular",
                "shouldIgnore": bool(gitignore) and _gitignored(gitignore, path),
            }
            existing = head.files.get(path)
            if existing is not None:
                entry["oid"] = existing.etag
            result.append(entry)
        return JSONResponse({"files": result, "commitOid": head.oid})

    def _h_commit(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._writable_repo(params, user)
        ref = self._writable_ref(repo, params["rev"])
        lines = []
        for raw in body.splitlines():
            if raw.strip():
                try:
                    lines.append(json.loads(raw))
                except ValueError as err:
                    raise _HubError(400, f"Invalid ndjson line: {err}") from None
        headers_lines = [line for line in lines if line.get("key") == "header"]
        if len(headers_lines) != 1:
            raise _HubError(400, "The commit payload must start with exactly one 'header' line")
        header = headers_lines[0].get("value") or {}
        title = header.get("summary") or ""
        if not title.strip():
            raise _HubError(400, "A commit summary is required")
        head = self._ref_head(repo, ref)
        parent_commit = header.get("parentCommit")
        if parent_commit is not None and parent_commit != head.oid:
            raise _HubError(412, "A commit has happened since. Please refresh and try again.")

        files = dict(head.files)
        for line in lines:
            key, value = line.get("key"), line.get("value") or {}
            if key == "header":
                continue
            path = _check_repo_path(value.get("path"), folder=key == "deletedFolder")
            if key == "file":
                content = value.get("content") or ""
                if (value.get("encoding") or "base64") == "base64":
                    try:
                        data = base64.b64decode(content, validate=True)
                    except ValueError:
                        raise _HubError(400, f"Invalid base64 content for {path}") from None
                else:
                    data = content.encode()
                files[path] = Blob(data, lfs=False)
            elif key == "lfsFile":
                oid = value.get("oid") or ""
                if value.get("algo", "sha256") != "sha256" or not _SHA256_RE.match(oid):
                    raise _HubError(400, f"Invalid LFS oid for {path}")
                data = self._lfs_store.get(oid)
                if data is None:
                    raise _HubError(422, f"Your push was rejected because an LFS pointer pointed to a file that "
                                         f"does not exist: {path} ({oid})")
                if value.get("size") is not None and int(value["size"]) != len(data):
                    raise _HubError(422, f"LFS object size mismatch for {path}")
                files[path] = Blob(data, lfs=True)
            elif key == "deletedFile":
                if path not in files:
                    raise _HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del files[path]
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                doomed = [p for p in files if p.startswith(prefix)]
                if not doomed:
                    raise _HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                for p in doomed:
                    del files[p]
            else:
                raise _HubError(400, f"Unknown commit operation key: {key!r}")

        pr_url = None
        if _truthy(request.query_params.get("create_pr")):
            number = max(repo.prs, default=0) + 1
            repo.prs[number] = head.oid
            ref = ("pr", number)
            pr_url = f"{self._repo_url(repo.repo_type, repo.repo_id)}/discussions/{number}"
        # Like the real Hub, a payload without operations still makes a (empty) commit.
        commit = self._new_commit(repo, head.oid, files, title, header.get("description") or "", user or self.user)
        self._move_ref(repo, ref, commit.oid)
        return JSONResponse({
            "success": True,
            "commitOid": commit.oid,
            "commitUrl": f"{self._repo_url(repo.repo_type, repo.repo_id)}/commit/{commit.oid}",
            "pullRequestUrl": pr_url,
            "hookOutput": "",
        })

    def _h_create_branch(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._writable_repo(params, user)
        branch = params["branch"]
        if not _REF_NAME_RE.match(branch) or branch.startswith("refs/") or ".." in branch:
            raise _HubError(400, f"Invalid branch name: {branch}")
        if branch in repo.branches:
            raise _HubError(409, f"Reference already exists: refs/heads/{branch}")
        start = self._json(body).get("startingPoint")
        commit = self._resolve(repo, start) if start else repo.commits[repo.branches["main"]]
        repo.branches[branch] = commit.oid
        return JSONResponse({})

    def _h_delete_branch(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._writable_repo(params, user)
        branch = params["branch"]
        if branch not in repo.branches:
            raise _HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
        if branch == "main":
            raise _HubError(403, "You cannot delete the default branch")
        del repo.branches[branch]
        return JSONResponse({})

    def _h_create_tag(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._writable_repo(params, user)
        commit = self._resolve(repo, params["rev"])
        tag = self._json(body).get("tag")
        if not isinstance(tag, str) or not _REF_NAME_RE.match(tag) or ".." in tag:
            raise _HubError(400, f"Invalid tag name: {tag!r}")
        if tag in repo.tags:
            raise _HubError(409, f"Tag already exists: {tag}")
        repo.tags[tag] = commit.oid
        return JSONResponse({})

    def _h_delete_tag(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        repo = self._writable_repo(params, user)
        if params["tag"] not in repo.tags:
            raise _HubError(404, f"Invalid rev id: {params['tag']}", "RevisionNotFound")
        del repo.tags[params["tag"]]
        return JSONResponse({})

    # ------------------------------------------------------------------ handlers: git-lfs
    def _h_lfs_batch(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        self._writable_repo(params, user, api_route=False)
        payload = self._json(body)
        if payload.get("operation") != "upload":
            raise _HubError(400, "The test Hub only implements the LFS 'upload' operation")
        objects = []
        for obj in payload.get("objects") or []:
            oid, size = str(obj.get("oid", "")), obj.get("size")
            if not _SHA256_RE.match(oid) or not isinstance(size, int) or size < 0:
                objects.append({"oid": oid, "size": size if isinstance(size, int) else 0,
                                "error": {"code": 422, "message": "Invalid oid or size"}})
                continue
            stored = self._lfs_store.get(oid)
            if stored is not None and len(stored) == size:
                objects.append({"oid": oid, "size": size, "authenticated": True})  # nothing to upload
                continue
            ticket = secrets.token_hex(16)
            self._lfs_tickets[ticket] = (oid, size)
            objects.append({
                "oid": oid,
                "size": size,
                "authenticated": True,
                "actions": {
                    "upload": {"href": f"{self.url}/__lfs/upload/{oid}?ticket={ticket}", "expires_in": 3600},
                    "verify": {"href": f"{self.url}/__lfs/verify", "header": {}},
                },
            })
        return JSONResponse({"transfer": "basic", "objects": objects}, media_type="application/vnd.git-lfs+json")

    def _h_lfs_put(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        ticket = request.query_params.get("ticket") or ""
        expected = self._lfs_tickets.get(ticket)
        if expected is None or expected[0] != params["oid"]:
            raise _HubError(403, "Invalid or expired upload URL")
        oid, size = expected
        if len(body) != size or hashlib.sha256(body).hexdigest() != oid:
            raise _HubError(400, f"Uploaded content does not match oid {oid} / size {size}")
        self._lfs_store[oid] = bytes(body)
        del self._lfs_tickets[ticket]
        return Response(status_code=200)

    def _h_lfs_verify(self, request: Request, params: dict, user: str | None, body: bytes) -> Response:
        if user is None and not self._open:
            raise _HubError(401, "Invalid username or password.")
        payload = self._json(body)
        data = self._lfs_store.get(str(payload.get("oid")))
        if data is None or len(data) != payload.get("size"):
            raise _HubError(422, f"LFS object {payload.get('oid')} was not uploaded")
        return JSONResponse({})


# ---------------------------------------------------------------------- small pure helpers
def _front_matter(content: str) -> str | None:
    if not content.startswith("---"):
        return None
    m = re.match(r"^---[ \t]*\r?\n(.*?)(?:\r?\n)?---[ \t]*(?:\r?\n|$)", content, flags=re.S)
    return m.group(1) if m else None


def _card_data(readme: Blob | None) -> dict:
    if readme is None:
        return {}
    text = _front_matter(readme.data.decode(errors="replace"))
    if text is None:
        return {}
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception:  # noqa: BLE001 - invalid YAML just means "no card data"
        return {}
    return data if isinstance(data, dict) else {}


def _tree_oid(files: Mapping[str, Blob], directory: str) -> str:
    prefix = directory.rstrip("/") + "/"
    digest = hashlib.sha1(b"tree\0")
    for path in sorted(p for p in files if p.startswith(prefix)):
        digest.update(path[len(prefix):].encode() + b"\0" + files[path].git_oid.encode())
    return digest.hexdigest()


def _check_repo_path(path: Any, *, folder: bool = False) -> str:
    if not isinstance(path, str) or not path:
        raise _HubError(400, "Missing path in commit operation")
    clean = path.rstrip("/") if folder else path
    parts = clean.split("/")
    if clean.startswith("/") or any(p in ("", ".", "..") for p in parts) or ".git" in parts:
        raise _HubError(400, f"Invalid path in commit operation: {path!r}")
    return clean


def _gitignored(gitignore: str, path: str) -> bool:
    ignored = False
    parts = path.split("/")
    for raw in gitignore.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.rstrip("/")
        anchored = "/" in pattern
        pattern = pattern.lstrip("/")
        if anchored:
            hit = fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern + "/*")
        else:
            hit = any(fnmatch.fnmatchcase(part, pattern) for part in parts)
        if hit:
            ignored = not negate
    return ignored


def _matches_gitattributes_lfs(gitattributes: str, path: str) -> bool:
    tracked = False
    for raw in gitattributes.splitlines():
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        pattern, attrs = fields[0], fields[1:]
        if "/" in pattern:
            hit = fnmatch.fnmatchcase(path, pattern.lstrip("/").replace("**/", "*"))
        else:
            hit = fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
        if hit:
            if "filter=lfs" in attrs:
                tracked = True
            elif "-filter" in attrs or "!filter" in attrs:
                tracked = False
    return tracked


def _with_query(request: Request, **updates: Any) -> str:
    query = {k: v for k, v in request.query_params.items()}
    query.update({k: str(v) for k, v in updates.items()})
    return f"{str(request.base_url).rstrip('/')}{request.scope.get('raw_path', b'').decode('latin-1')}?{urlencode(query)}"


# ---------------------------------------------------------------------- running the real client
_RESULT_MARKER = "@@HUB_CLIENT_RESULT@@"

_CLIENT_PRELUDE = r"""
import json, sys, traceback
_code = sys.argv[1]
_ns = {"__name__": "__hub_client__"}
try:
    exec(compile(_code, "<hub-client>", "exec"), _ns)
    _out = {"ok": True, "value": _ns.get("result")}
except BaseException as _e:  # report the exception to the test process
    _resp = getattr(_e, "response", None)
    _out = {
        "ok": False,
        "error": type(_e).__name__,
        "error_mro": [c.__name__ for c in type(_e).__mro__],
        "message": str(_e),
        "status_code": getattr(_resp, "status_code", None),
        "traceback": traceback.format_exc(),
        "value": _ns.get("result"),
    }
sys.stdout.flush()
print("\n" + MARKER + json.dumps(_out, default=str))
""".replace("MARKER", repr(_RESULT_MARKER))


@dataclass
class ClientResult:
    returncode: int
    stdout: str
    stderr: str
    ok: bool
    value: Any = None
    error: str | None = None
    error_mro: list = field(default_factory=list)
    message: str = ""
    status_code: int | None = None
    traceback: str = ""

    def raised(self, name: str) -> bool:
        """True if the snippet raised an exception that is (a subclass of) class ``name``."""
        return not self.ok and name in self.error_mro

    def unwrap(self) -> Any:
        if not self.ok:
            raise AssertionError(f"hub client raised {self.error}: {self.message}\n{self.traceback}\n"
                                 f"--- stderr ---\n{self.stderr[-4000:]}")
        return self.value


_SCRUBBED_ENV_PREFIXES = ("HF_", "HUGGING_FACE_", "HUGGINGFACE_", "TRANSFORMERS_", "HF_HUB_")
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def client_env(
    server: HubServer | str | None = None,
    *,
    hf_home: str | os.PathLike,
    token: str | None | bool = True,
    offline: bool = False,
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a subprocess that uses ``huggingface_hub`` against ``server``.

    ``server`` may be a :class:`HubServer` or an endpoint URL (e.g. an olah mirror).
    ``token=True`` uses the server's token (if any); a string uses that token; ``None``
    or ``False`` sends no token.  Inherited ``HF_*``/``TRANSFORMERS_*`` variables and
    proxies are dropped so nothing on the machine can point the client elsewhere.
    """
    env = {k: v for k, v in (base if base is not None else os.environ).items()
           if not k.startswith(_SCRUBBED_ENV_PREFIXES) and k not in _PROXY_VARS}
    endpoint = server.url if isinstance(server, HubServer) else server
    hf_home = Path(hf_home)
    hf_home.mkdir(parents=True, exist_ok=True)
    env.update({
        "HF_HOME": str(hf_home),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
        "HF_HUB_DOWNLOAD_TIMEOUT": "10",
        "NO_PROXY": "127.0.0.1,localhost,::1",
        "no_proxy": "127.0.0.1,localhost,::1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
    })
    if endpoint is not None:
        env["HF_ENDPOINT"] = endpoint.rstrip("/")
    if token is True:
        token = server.token if isinstance(server, HubServer) else None
    if token:
        env["HF_TOKEN"] = str(token)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if extra:
        env.update(extra)
    return env


def run_client(code: str, *, env: Mapping[str, str], timeout: float = 120, cwd: str | os.PathLike | None = None,
               python: str = sys.executable) -> ClientResult:
    """Run ``code`` with ``python`` in a fresh process; the snippet's ``result`` comes back as JSON."""
    proc = subprocess.run(
        [python, "-c", _CLIENT_PRELUDE, code],
        env=dict(env),
        cwd=str(cwd) if cwd is not None else env.get("HF_HOME"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    payload = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_MARKER):
            payload = json.loads(line[len(_RESULT_MARKER):])
            break
    if payload is None:
        return ClientResult(proc.returncode, proc.stdout, proc.stderr, ok=False, error="ClientCrashed",
                            message=f"no result from the client process (rc={proc.returncode})",
                            traceback=proc.stderr[-4000:])
    return ClientResult(
        returncode=proc.returncode,
        stdout=proc.stdout,
        stderr=proc.stderr,
        ok=payload["ok"],
        value=payload.get("value"),
        error=payload.get("error"),
        error_mro=payload.get("error_mro") or [],
        message=payload.get("message") or "",
        status_code=payload.get("status_code"),
        traceback=payload.get("traceback") or "",
    )


# ---------------------------------------------------------------------- pytest fixtures
try:
    import pytest
except ImportError:  # pragma: no cover - the module is also usable outside pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def hub_server_factory() -> Iterator[Callable[..., HubServer]]:
        """``factory(**kwargs)`` -> a started :class:`HubServer`; all are stopped after the test."""
        started: list[HubServer] = []

        def factory(**kwargs: Any) -> HubServer:
            server = HubServer(**kwargs).start()
            started.append(server)
            return server

        yield factory
        errors = []
        for server in started:
            server.stop()
            errors.extend(server.errors)
        if errors:
            pytest.fail("test Hub handler errors:\n" + "\n".join(errors), pytrace=False)

    @pytest.fixture
    def hub_server(hub_server_factory: Callable[..., HubServer]) -> HubServer:
        """A started test Hub with ``DEFAULT_TOKEN`` (user ``tester``, org ``bitfit-org``)."""
        return hub_server_factory()

    @pytest.fixture
    def hf_home(tmp_path: Path) -> Path:
        """A fresh, empty ``HF_HOME`` for the client processes of one test."""
        path = tmp_path / "hf_home"
        path.mkdir()
        return path

    @pytest.fixture
    def hub_client(hub_server: HubServer, hf_home: Path) -> Callable[..., ClientResult]:
        """``hub_client(code, server=None, hf_home=None, timeout=120, cwd=None, **client_env kwargs)``."""
        default_server, default_home = hub_server, hf_home

        def run(code: str, *, server: HubServer | str | None = None, hf_home: str | os.PathLike | None = None,
                timeout: float = 120, cwd: str | os.PathLike | None = None, **env_kwargs: Any) -> ClientResult:
            env = client_env(server if server is not None else default_server,
                             hf_home=hf_home if hf_home is not None else default_home, **env_kwargs)
            return run_client(code, env=env, timeout=timeout, cwd=cwd)

        return run
