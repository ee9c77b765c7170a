"""Bias-only adapters on the Hugging Face Hub: push with a generated model card, pull onto a stock model.

Push (:func:`push_adapter_to_hub`, ``BitFitAdapter.push_to_hub``, ``BitFitTrainer.push_to_hub``)

* creates the repo if needed (``private=`` applies on creation) and the branch ``revision`` if it
  does not exist yet;
* stages the adapter files (``adapter_model.safetensors``, ``adapter_config.json``,
  ``trainable_summary.json``), the bias-change map (``bias_change.json`` / ``.png``) and the model
  card (``README.md``) in a temporary folder, and uploads them in **one** commit, deleting only stale
  copies of those same files; nothing else in the repo is touched;
* compares every file with the remote one first (git blob sha-1, or the LFS sha-256) and makes **no
  commit** when nothing changed;
* pins the commit to the branch head it compared against (``parent_commit``), so a concurrent push
  fails cleanly instead of mixing two adapters.

The token is passed to ``huggingface_hub`` only; it is never printed, logged or written.

Pull (:func:`download_adapter`, used by ``BitFitAdapter.from_pretrained`` / ``AutoBitFitModel`` /
``load_adapter`` / ``AdapterBank.add`` for anything that is not a local directory)

* downloads the weights file first at ``revision`` (branch, tag or commit), then the other adapter
  files **at the commit that resolved to**, so the files always come from one commit, which is
  returned (and recorded as ``adapter.config.metadata["resolved_commit"]``);
* uses the normal Hub cache (``HF_HOME`` / ``HF_HUB_CACHE`` / ``cache_dir=``); with
  ``HF_HUB_OFFLINE=1`` or ``local_files_only=True`` an adapter downloaded once loads from the cache;
* ``local_dir=`` also copies the files into a folder, each replaced atomically, weights last.

Errors a user meets (repo or revision not found, 401/403, network down, offline and not cached) are
raised as :class:`HubError` subclasses with a message that says what to do, never as a raw HTTP
traceback; a failed download leaves no partial file behind.

``HF_ENDPOINT`` selects another Hub (a mirror, or a test server); like every ``huggingface_hub`` user
it must be set before ``huggingface_hub`` is first imported.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

from . import __version__
from .adapter_config import CONFIG_NAME, SUMMARY_NAME, WEIGHTS_NAME, AdapterConfig, AdapterError
from .heatmap import BIAS_CHANGE_JSON, BIAS_CHANGE_PNG
from .adapter import canonical_safetensors
from .io import atomic_path, write_bytes_atomic, write_json_atomic, write_text_atomic

logger = logging.getLogger(__name__)

README_NAME = "README.md"
ADAPTER_FILES = (WEIGHTS_NAME, CONFIG_NAME, SUMMARY_NAME, BIAS_CHANGE_JSON)
"""Files a pull downloads (only the weights file is required)."""
MANAGED_FILES = (WEIGHTS_NAME, CONFIG_NAME, SUMMARY_NAME, BIAS_CHANGE_JSON, BIAS_CHANGE_PNG, README_NAME)
"""Files a push writes (and deletes when stale); every other file in the repo is left alone."""
DEFAULT_COMMIT_MESSAGE = "Upload BitFit adapter"
_LOAD_ONLY_METADATA = ("resolved_repo", "resolved_commit")
_WARNED_LOCAL_BASES: set = set()


# ---- errors ----------------------------------------------------------------------------------------


class HubError(OSError):
    """A Hub operation on a BitFit adapter failed; the message says why and what to do.

    ``original`` holds the ``huggingface_hub`` / HTTP exception, for debugging.
    """

    original: Optional[BaseException] = None


class HubRepoNotFoundError(HubError):
    """The repo does not exist, or is private / gated and the request was not authenticated."""


class HubRevisionNotFoundError(HubError):
    """The repo exists but has no such branch, tag or commit."""


class HubAdapterNotFoundError(HubError):
    """The repo exists at that revision but holds no BitFit adapter."""


class HubAuthError(HubError):
    """The token is missing, invalid, or lacks the permission needed (HTTP 401 / 403, gated repos)."""


class HubConnectionError(HubError):
    """The Hub could not be reached (network down, wrong ``HF_ENDPOINT``, server error)."""


class HubOfflineError(HubConnectionError):
    """Offline mode (``HF_HUB_OFFLINE=1`` / ``local_files_only=True``) and the files are not cached."""


class HubConflictError(HubError):
    """The branch moved while pushing (another push landed first)."""


def _status(err: BaseException) -> Optional[int]:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _server_says(err: BaseException) -> str:
    message = getattr(err, "server_message", None)
    return f" (the server said: {message.strip()})" if message and message.strip() else ""


def _is_connection_error(err: BaseException) -> bool:
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    if isinstance(err, OSError) and err.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH,
                                                  errno.ENETUNREACH, errno.ETIMEDOUT):
        return True
    module = type(err).__module__.split(".")[0]
    if module in ("httpx", "httpx2", "httpcore", "requests", "urllib3"):
        name = type(err).__name__
        return any(word in name for word in ("Connect", "Timeout", "Network", "Protocol", "ReadError", "WriteError"))
    return False


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _translate(err: BaseException, action: str, repo_id: str, revision: Optional[str], local_files_only: bool = False) -> Optional[HubError]:
    """A :class:`HubError` for a ``huggingface_hub`` / network exception, or ``None`` to re-raise it."""
    from huggingface_hub import errors as hf

    where = repo_id + (f"@{revision}" if revision else "")
    endpoint = _endpoint()
    auth_hint = "pass token=..., set HF_TOKEN, or run `hf auth login`"
    pushing = action == "push"

    if isinstance(err, hf.HFValidationError):
        return HubError(
            f"{repo_id!r} is neither a local adapter directory nor a valid Hub repo id ('namespace/name'): "
            f"check the path or the id ({err})."
        )
    if isinstance(err, hf.LocalEntryNotFoundError) or isinstance(err, hf.OfflineModeIsEnabled):
        cause = err.__cause__ or err.__context__
        if cause is not None and not isinstance(cause, (hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled)) \
                and not (local_files_only or _offline()):
            inner = _translate(cause, action, repo_id, revision)
            if inner is not None:
                return inner
        if local_files_only or _offline():
            flag = "local_files_only=True" if local_files_only else "HF_HUB_OFFLINE=1"
            if pushing:
                return HubOfflineError(f"Cannot {action} {where}: {flag} is set and pushing needs the network. Unset it.")
            return HubOfflineError(
                f"{where} is not in the local Hub cache and {flag} forbids downloading it. Download it once "
                "online (the same call without offline mode), or pin a revision that was downloaded before "
                "(a branch or tag resolves through the cache's refs; a commit hash always works)."
            )
        return HubConnectionError(
            f"Cannot reach the Hub at {endpoint} to {action} {where}, and it is not in the local cache. Check "
            "your network, proxy and HF_ENDPOINT; once an adapter has been downloaded, HF_HUB_OFFLINE=1 loads it "
            "from the cache."
        )
    if isinstance(err, hf.GatedRepoError):
        return HubAuthError(
            f"{repo_id} is a gated repo and this request is not allowed in: request access on "
            f"{endpoint}/{repo_id}, then authenticate ({auth_hint}).{_server_says(err)}"
        )
    if isinstance(err, hf.RepositoryNotFoundError):
        if pushing:
            return HubRepoNotFoundError(
                f"Cannot push to {repo_id}: it does not exist and could not be created, or the token cannot see "
                f"it. Check the repo id and that the token has write access to the namespace ({auth_hint})."
                f"{_server_says(err)}"
            )
        return HubRepoNotFoundError(
            f"No repo {repo_id!r} on {endpoint}: check the id ('namespace/name'). If it is private, "
            f"authenticate ({auth_hint}).{_server_says(err)}"
        )
    if isinstance(err, hf.RevisionNotFoundError):
        return HubRevisionNotFoundError(
            f"{repo_id} has no revision {revision!r} (a branch, tag or commit hash). "
            f"{_refs_hint(repo_id)}{_server_says(err)}"
        )
    if isinstance(err, hf.RemoteEntryNotFoundError):
        return HubAdapterNotFoundError(
            f"{where} holds no {WEIGHTS_NAME}: it is not a BitFit adapter repo (a full model? a PEFT adapter?), "
            "or the adapter lives in a subfolder (pass subfolder=...)."
        )
    status = _status(err)
    if status == 401:
        return HubAuthError(
            f"The Hub at {endpoint} refused the credentials while trying to {action} {where} (401): the token is "
            f"missing, invalid or expired; {auth_hint}.{_server_says(err)}"
        )
    if status == 403:
        need = "write" if pushing else "read"
        return HubAuthError(
            f"Access denied (403) while trying to {action} {where}: the token lacks {need} permission for this "
            f"repo or namespace. Use a token with {need} access (fine-grained tokens need it per repo/org)."
            f"{_server_says(err)}"
        )
    if status == 412:
        return HubConflictError(
            f"{where} changed while pushing (another commit landed first); nothing was committed. Push again."
        )
    if status is not None and status >= 500:
        return HubConnectionError(
            f"The Hub at {endpoint} failed with HTTP {status} while trying to {action} {where}; nothing was "
            f"changed. Try again later.{_server_says(err)}"
        )
    if status is not None and status >= 400:
        return HubError(f"The Hub refused to {action} {where} (HTTP {status}).{_server_says(err)}")
    if _is_connection_error(err):
        hint = "" if pushing else " Once an adapter has been downloaded, HF_HUB_OFFLINE=1 loads it from the cache."
        return HubConnectionError(
            f"Cannot reach the Hub at {endpoint} to {action} {where} ({type(err).__name__}): check your network, "
            f"proxy and HF_ENDPOINT.{hint}"
        )
    return None


def _refs_hint(repo_id: str) -> str:
    try:
        from huggingface_hub import HfApi

        refs = HfApi().list_repo_refs(repo_id)
        branches = ", ".join(b.name for b in refs.branches) or "none"
        tags = ", ".join(t.name for t in refs.tags) or "none"
        return f"Branches: {branches}; tags: {tags}."
    except Exception:  # noqa: BLE001 - only a hint
        return "List them with `HfApi().list_repo_refs(repo_id)`."


@contextmanager
def _hub_errors(action: str, repo_id: str, revision: Optional[str] = None, local_files_only: bool = False) -> Iterator[None]:
    try:
        yield
    except HubError:
        raise
    except Exception as err:  # noqa: BLE001 - translated or re-raised unchanged
        translated = _translate(err, action, repo_id, revision, local_files_only)
        if translated is None:
            raise
        translated.original = err
        raise translated from None


# ---- pull ------------------------------------------------------------------------------------------


def download_adapter(
    repo_id: str,
    revision: Optional[str] = None,
    token: Union[None, bool, str] = None,
    cache_dir: Optional[str] = None,
    local_files_only: bool = False,
    force_download: bool = False,
    subfolder: Optional[str] = None,
    local_dir: Optional[str] = None,
) -> Tuple[str, str]:
    """Download a BitFit adapter from the Hub; returns ``(local directory, resolved commit sha)``.

    ``revision``: branch, tag or commit (default ``main``). The directory is the snapshot folder in
    the Hub cache, or ``local_dir`` when given (files copied there atomically, weights last).
    """
    from huggingface_hub import hf_hub_download

    common = dict(subfolder=subfolder or None, cache_dir=cache_dir, token=token,
                  library_name="bitfit-hf", library_version=__version__)
    with _partial_downloads_removed(repo_id, cache_dir):
        with _hub_errors("download", repo_id, revision, local_files_only):
            weights = hf_hub_download(repo_id, WEIGHTS_NAME, revision=revision, local_files_only=local_files_only,
                                      force_download=force_download, **common)
        directory = os.path.dirname(weights)
        commit = _commit_of(weights) or revision or ""
        _fetch_optional_files(repo_id, commit or revision, subfolder, cache_dir, token, local_files_only,
                              force_download, common)
    logger.info("Adapter %s%s resolved to commit %s", repo_id, f"@{revision}" if revision else "", commit)
    if local_dir:
        directory = _copy_adapter(directory, local_dir)
    return directory, commit


def _fetch_optional_files(repo_id, revision, subfolder, cache_dir, token, local_files_only, force_download, common):
    """The adapter files besides the weights (the weights embed the config, so each is optional).

    Cached files are used as they are; otherwise one quick HEAD (no retries) decides: a missing file
    is skipped, and a connection failure stops further attempts, so a pull with the network down
    and the weights cached never waits on the client's retry back-off.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    online = not (local_files_only or _offline())
    for name in ADAPTER_FILES[1:]:
        path_in_repo = f"{subfolder.strip('/')}/{name}" if subfolder else name
        if not force_download:
            cached = try_to_load_from_cache(repo_id, path_in_repo, cache_dir=cache_dir, revision=revision)
            if cached is not None:  # a path, or the marker of a file known not to exist
                continue
        if not online:
            continue
        try:
            get_hf_file_metadata(hf_hub_url(repo_id, path_in_repo, revision=revision), token=token)
            hf_hub_download(repo_id, name, revision=revision, force_download=force_download, **common)
        except Exception as err:  # noqa: BLE001 - optional files: the weights embed the config
            translated = _translate(err, "download", repo_id, revision)
            if translated is None and not isinstance(err, OSError):
                raise
            if isinstance(translated, HubConnectionError):
                online = False
            logger.debug("%s: no %s at %s (%s); continuing.", repo_id, name, revision, type(err).__name__)


def _commit_of(path: str) -> Optional[str]:
    parts = Path(path).parts
    if "snapshots" in parts:
        index = len(parts) - 1 - parts[::-1].index("snapshots")
        if index + 1 < len(parts):
            return parts[index + 1]
    return None


def _copy_adapter(source: str, target: str) -> str:
    os.makedirs(target, exist_ok=True)
    names = [n for n in ADAPTER_FILES[1:] if os.path.isfile(os.path.join(source, n))] + [WEIGHTS_NAME]
    for name in names:  # the weights file last: it is the commit point of an adapter directory
        with atomic_path(os.path.join(target, name)) as tmp:
            shutil.copyfile(os.path.join(source, name), tmp)
    return target


@contextmanager
def _partial_downloads_removed(repo_id: str, cache_dir: Optional[str]) -> Iterator[None]:
    """On failure, remove the ``*.incomplete`` blobs this download left in the cache."""
    blobs = None
    before: set = set()
    try:
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        root = Path(cache_dir or constants.HF_HUB_CACHE)
        blobs = root / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
        before = set(blobs.glob("*.incomplete")) if blobs.is_dir() else set()
    except Exception:  # noqa: BLE001 - an invalid repo id fails later with a clear message
        blobs = None
    try:
        yield
    except BaseException:
        if blobs is not None and blobs.is_dir():
            for path in set(blobs.glob("*.incomplete")) - before:
                try:
                    path.unlink()
                except OSError:
                    pass
        raise


# ---- push ------------------------------------------------------------------------------------------


def create_adapter_repo(
    repo_id: str,
    token: Union[None, bool, str] = None,
    private: Optional[bool] = None,
    exist_ok: bool = True,
) -> str:
    """Create the model repo if needed; returns its full id (``namespace/name``)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token, library_name="bitfit-hf", library_version=__version__)
    with _hub_errors("create", repo_id):
        return api.create_repo(repo_id, private=private, exist_ok=exist_ok, repo_type="model").repo_id


def push_adapter_to_hub(
    adapter,
    repo_id: str,
    token: Union[None, bool, str] = None,
    private: Optional[bool] = None,
    revision: Optional[str] = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    commit_description: Optional[str] = None,
    model_card: Any = True,
    create_pr: bool = False,
    base_model: Optional[str] = None,
    base=None,
    bias_change=None,
    summary: Optional[dict] = None,
    eval_results=None,
    **card_kwargs,
):
    """Push a BitFit adapter (a :class:`~bitfit_hf.BitFitAdapter`, an adapter directory, or a model
    prepared with ``apply_bitfit``) to ``repo_id`` in one commit; returns the
    ``huggingface_hub.CommitInfo`` (of the existing head when nothing changed).

    * ``model_card``: ``True`` generates the card (see :mod:`bitfit_hf.model_card`), a string or
      ``ModelCard`` is used as is, ``False`` leaves the repo's README alone.
    * ``base_model``: the Hub id of the base, recorded in the card and, when the adapter records only
      a local path, in the pushed ``adapter_config.json`` so that ``AutoBitFitModel`` works anywhere.
    * ``base`` (the base model, a dict of its biases, or its checkpoint) or ``bias_change``: inputs of
      the bias-change heat map; by default a stored ``bias_change.json`` or the recorded base (when it
      is a local folder or already cached) is used, else the card has no heat map.
    * ``summary``, ``eval_results`` and ``card_kwargs`` (``dataset``, ``dataset_name``, ``license``,
      ``language``, ``tags``, ``model_name``, ``hyperparameters``) go into the card.
    """
    from .adapter import BitFitAdapter
    from .model_card import (
        read_eval_results,
        resolve_bias_change,
        summary_from_adapter,
        write_bias_change_files,
        write_model_card_files,
    )

    source_dir = str(adapter) if isinstance(adapter, (str, os.PathLike)) else None
    model_summary = None
    if source_dir is not None:
        adapter = BitFitAdapter.from_directory(source_dir)
    elif not isinstance(adapter, BitFitAdapter):
        from .model import get_bitfit_state

        state = get_bitfit_state(adapter)
        model_summary = state.summary.to_dict() if state is not None else None
        adapter = BitFitAdapter.from_model(adapter)
    publish = publishable_adapter(adapter, base_model)
    change = resolve_bias_change(adapter, source_dir, base=base, bias_change=bias_change)
    with tempfile.TemporaryDirectory(prefix="bitfit-hub-push-") as stage:
        publish.save_pretrained(stage)
        canonicalize_safetensors(os.path.join(stage, WEIGHTS_NAME))
        summary = summary or _read_json(source_dir, SUMMARY_NAME) or model_summary or summary_from_adapter(adapter)
        if summary:
            write_json_atomic(os.path.join(stage, SUMMARY_NAME), summary)
        if eval_results is None and source_dir:
            eval_results = read_eval_results(source_dir) or None
        if model_card is True or model_card is None:
            write_model_card_files(stage, publish, repo_id, bias_change=change, summary=summary,
                                   eval_results=eval_results, heatmap=change is not None, base_model=base_model,
                                   **card_kwargs)
        else:
            write_bias_change_files(stage, change, publish.config, repo_id)
            if model_card is not False:
                write_text_atomic(os.path.join(stage, README_NAME), str(model_card))
        return push_adapter_folder(stage, repo_id, token=token, private=private, revision=revision,
                                   commit_message=commit_message, commit_description=commit_description,
                                   create_pr=create_pr, manage_readme=model_card is not False)


def publishable_adapter(adapter, base_model: Optional[str] = None):
    """The adapter as it should appear on the Hub: without load-time metadata (``resolved_commit``),
    and with the base model's Hub id when it records only a local path (``base_model`` overrides)."""
    from .adapter import BitFitAdapter
    from .model_card import hub_base_model_id

    base_id = hub_base_model_id(adapter.config, base_model)
    data = adapter.config.to_dict()
    data["metadata"] = {k: v for k, v in (data.get("metadata") or {}).items() if k not in _LOAD_ONLY_METADATA}
    recorded = data.get("base_model_name_or_path") or ""
    if base_id and base_id != recorded:
        if recorded:
            logger.info("Recording the base model as %r (the adapter recorded %r).", base_id, _display_path(recorded))
        data["base_model_name_or_path"] = base_id
    elif recorded and os.path.exists(recorded) and recorded not in _WARNED_LOCAL_BASES:
        _WARNED_LOCAL_BASES.add(recorded)
        logger.warning(
            "The adapter records its base model as a local path (%s): users of the Hub repo will have to pass "
            "base_model= themselves. Pass base_model='namespace/name' (the base's Hub id) when pushing.",
            _display_path(recorded),
        )
    return BitFitAdapter(AdapterConfig.from_dict(data), adapter.tensors)


def canonicalize_safetensors(path: str) -> None:
    """Rewrite a safetensors file with its header metadata in sorted order (see ``canonical_safetensors``)."""
    with open(path, "rb") as handle:
        data = handle.read()
    canonical = canonical_safetensors(data)
    if canonical != data:
        write_bytes_atomic(path, canonical)


def _display_path(path: str) -> str:
    return os.path.basename(os.path.normpath(path)) or path


def push_adapter_folder(
    folder: str,
    repo_id: str,
    token: Union[None, bool, str] = None,
    private: Optional[bool] = None,
    revision: Optional[str] = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    commit_description: Optional[str] = None,
    create_pr: bool = False,
    manage_readme: bool = True,
):
    """Upload the adapter files of ``folder`` (see :data:`MANAGED_FILES`) in one commit, or make no
    commit when the remote files are identical. Returns a ``huggingface_hub.CommitInfo``."""
    from huggingface_hub import CommitInfo, CommitOperationAdd, CommitOperationDelete, HfApi

    names = [n for n in MANAGED_FILES if os.path.isfile(os.path.join(folder, n))]
    if not manage_readme:
        names = [n for n in names if n != README_NAME]
    if WEIGHTS_NAME not in names:
        raise AdapterError(f"{folder} holds no {WEIGHTS_NAME}: nothing to push.")
    api = HfApi(token=token, library_name="bitfit-hf", library_version=__version__)
    target = revision or "main"
    with _hub_errors("push", repo_id, revision):
        if _offline():
            raise HubOfflineError(f"Cannot push to {repo_id}: HF_HUB_OFFLINE=1 is set and pushing needs the network.")
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
        if revision and not revision.startswith("refs/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        head, remote = _remote_files(api, repo_id, target)
        operations: List[Any] = []
        for name in names:
            path = os.path.join(folder, name)
            if name in remote and _same_content(path, remote[name]):
                continue
            operations.append(CommitOperationAdd(path_in_repo=name, path_or_fileobj=path))
        for name in MANAGED_FILES:
            if name in remote and name not in names and (name != README_NAME or manage_readme):
                operations.append(CommitOperationDelete(path_in_repo=name))
        if not operations:
            logger.info("%s@%s already holds this adapter (commit %s): nothing to push.", repo_id, target, head)
            return CommitInfo(
                commit_url=f"{api.endpoint}/{repo_id}/commit/{head}",
                commit_message="",
                commit_description="",
                oid=head or "",
                _endpoint=api.endpoint,
            )
        info = api.create_commit(
            repo_id,
            operations=operations,
            commit_message=commit_message,
            commit_description=commit_description,
            revision=revision,
            create_pr=create_pr,
            parent_commit=head if (head and not create_pr) else None,
        )
    changed = ", ".join(getattr(op, "path_in_repo", "?") for op in operations)
    logger.info("Pushed the BitFit adapter to %s (%s): %s", repo_id, info.oid, changed)
    return info


def _remote_files(api, repo_id: str, revision: str):
    """``(head commit sha, {path: RepoFile})`` of the top level of ``revision``."""
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        info = api.repo_info(repo_id, revision=revision)
    except RevisionNotFoundError:  # a repo without any commit yet
        return None, {}
    head = getattr(info, "sha", None)
    files = {}
    for item in api.list_repo_tree(repo_id, revision=head or revision, recursive=False):
        if hasattr(item, "blob_id"):
            files[item.path] = item
    return head, files


def _same_content(path: str, remote) -> bool:
    with open(path, "rb") as handle:
        data = handle.read()
    lfs = getattr(remote, "lfs", None)
    if lfs is not None and getattr(lfs, "sha256", None):
        return hashlib.sha256(data).hexdigest() == lfs.sha256
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return blob == getattr(remote, "blob_id", None)


def _read_json(directory: Optional[str], name: str) -> Optional[dict]:
    if not directory:
        return None
    from .model_card import _read_json as read

    return read(os.path.join(directory, name))


# ---- command line ----------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m bitfit_hf.hub push DIR REPO`` / ``python -m bitfit_hf.hub pull REPO``.

    The token comes from ``HF_TOKEN`` or ``hf auth login`` (there is no --token flag, so that it
    never lands in a shell history).
    """
    parser = argparse.ArgumentParser(prog="python -m bitfit_hf.hub", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    push = commands.add_parser("push", help="push an adapter directory with a generated model card")
    push.add_argument("directory")
    push.add_argument("repo_id")
    push.add_argument("--revision", help="branch to push to (created if missing)")
    push.add_argument("--private", action="store_true", default=None, help="create the repo private")
    push.add_argument("--base-model", help="Hub id of the base model (when the adapter records a local path)")
    push.add_argument("--commit-message", default=DEFAULT_COMMIT_MESSAGE)
    push.add_argument("--dataset", action="append", help="Hub dataset id for the card (repeatable)")
    push.add_argument("--license")
    pull = commands.add_parser("pull", help="download an adapter (prints the folder and the commit)")
    pull.add_argument("repo_id")
    pull.add_argument("--revision", help="branch, tag or commit")
    pull.add_argument("--local-dir", help="copy the adapter files here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "push":
            info = push_adapter_to_hub(args.directory, args.repo_id, private=args.private, revision=args.revision,
                                       commit_message=args.commit_message, base_model=args.base_model,
                                       dataset=args.dataset, license=args.license)
            print(info.commit_url)
        else:
            directory, commit = download_adapter(args.repo_id, revision=args.revision, local_dir=args.local_dir)
            print(directory)
            print(commit)
    except (HubError, AdapterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
