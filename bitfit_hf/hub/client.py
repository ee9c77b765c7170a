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

import hashlib
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple, Union

from bitfit_hf.adapters.adapter import canonical_safetensors
from bitfit_hf.adapters.config import AdapterConfig, AdapterError
from bitfit_hf.hub.errors import HubConnectionError, HubOfflineError, hub_errors, offline, translate
from bitfit_hf.utils.constants import (
    BIAS_CHANGE_JSON,
    BIAS_CHANGE_PNG,
    CONFIG_NAME,
    PEFT_SUBFOLDER,
    README_NAME,
    SUMMARY_NAME,
    WEIGHTS_NAME,
    __version__,
)
from bitfit_hf.utils.io import atomic_path, read_json_object, write_bytes_atomic, write_json_atomic, write_text_atomic
from bitfit_hf.utils.secrets import redact_text

logger = logging.getLogger(__name__)

ADAPTER_FILES = (WEIGHTS_NAME, CONFIG_NAME, SUMMARY_NAME, BIAS_CHANGE_JSON)
"""Files a pull downloads (only the weights file is required)."""
PEFT_FILES = (f"{PEFT_SUBFOLDER}/{CONFIG_NAME}", f"{PEFT_SUBFOLDER}/{WEIGHTS_NAME}")
"""The PEFT BEFT copy of the adapter (``peft.PeftModel.from_pretrained(model, repo_id, subfolder="peft")``)."""
MANAGED_FILES = (WEIGHTS_NAME, CONFIG_NAME, SUMMARY_NAME, BIAS_CHANGE_JSON, BIAS_CHANGE_PNG, README_NAME) + PEFT_FILES
"""Files a push writes (and deletes when stale); every other file in the repo is left alone."""
DEFAULT_COMMIT_MESSAGE = "Upload BitFit adapter"
_LOAD_ONLY_METADATA = ("resolved_repo", "resolved_commit")
_WARNED_LOCAL_BASES: set = set()


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
    unreachable = None
    if not (local_files_only or offline()):
        unreachable = _hub_unreachable(repo_id, WEIGHTS_NAME, revision, subfolder, token)
    with _partial_downloads_removed(repo_id, cache_dir):
        if unreachable is not None:
            weights = _cached_or_raise(unreachable, repo_id, revision, force_download, common)
            local_files_only = True
        else:
            with hub_errors("download", repo_id, revision, local_files_only):
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


def _hub_unreachable(repo_id: str, filename: str, revision: Optional[str], subfolder: Optional[str],
                     token) -> Optional[HubConnectionError]:
    """One quick metadata request (no retries) before downloading: the error when the Hub cannot be
    reached (network down, wrong ``HF_ENDPOINT``, HTTP 5xx), ``None`` otherwise.

    ``hf_hub_download`` retries such failures with exponential back-off (about 25 s) before giving up;
    a user waiting for an adapter is better served by the clear error at once, or by the cached copy.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    path_in_repo = f"{subfolder.strip('/')}/{filename}" if subfolder else filename
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, path_in_repo, revision=revision), token=token)
    except Exception as err:  # noqa: BLE001 - only connection failures matter here; the download reports the rest
        translated = translate(err, "download", repo_id, revision)
        if isinstance(translated, HubConnectionError):
            translated.original = err
            return translated
    return None


def _cached_or_raise(unreachable: HubConnectionError, repo_id, revision, force_download, common) -> str:
    """The cached weights file when the Hub is out of reach, else the connection error (no retries)."""
    from huggingface_hub import hf_hub_download

    if not force_download:
        try:
            path = hf_hub_download(repo_id, WEIGHTS_NAME, revision=revision, local_files_only=True, **common)
        except Exception:  # noqa: BLE001 - not cached (or the cache cannot tell): the connection error says it all
            path = None
        if path is not None:
            logger.warning("%s Using the copy in the local cache.", unreachable)
            return path
    raise unreachable


def _fetch_optional_files(repo_id, revision, subfolder, cache_dir, token, local_files_only, force_download, common):
    """The adapter files besides the weights (the weights embed the config, so each is optional).

    Cached files are used as they are; otherwise one quick HEAD (no retries) decides: a missing file
    is skipped, and a connection failure stops further attempts, so a pull with the network down
    and the weights cached never waits on the client's retry back-off.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    online = not (local_files_only or offline())
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
            translated = translate(err, "download", repo_id, revision)
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
    with hub_errors("create", repo_id):
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
    peft: Union[None, bool, str] = None,
    **card_kwargs,
):
    """Push a BitFit adapter (a :class:`~bitfit_hf.BitFitAdapter`, an adapter directory, or a model
    prepared with ``apply_bitfit``) to ``repo_id`` in one commit; returns the
    ``huggingface_hub.CommitInfo`` (of the existing head when nothing changed).

    * ``model_card``: ``True`` generates the card (see :mod:`bitfit_hf.reporting.model_card`), a string or
      ``ModelCard`` is used as is, ``False`` leaves the repo's README alone.
    * ``base_model``: the Hub id of the base, recorded in the card and, when the adapter records only
      a local path, in the pushed ``adapter_config.json`` so that ``AutoBitFitModel`` works anywhere.
    * ``base`` (the base model, a dict of its biases, or its checkpoint) or ``bias_change``: inputs of
      the bias-change heat map; by default a stored ``bias_change.json`` or the recorded base (when it
      is a local folder or already cached) is used, else the card has no heat map.
    * ``summary``, ``eval_results`` and ``card_kwargs`` (``dataset``, ``dataset_name``, ``license``,
      ``language``, ``tags``, ``model_name``, ``hyperparameters``) go into the card.
    * ``peft``: a PEFT BEFT copy of the adapter pushed as ``peft/`` (loadable with plain ``peft``, and
      the card then shows how): a folder written by ``bitfit-hf export-peft``; ``True`` exports one now
      (loads the recorded base); ``None`` takes ``<adapter folder>/peft`` when there is one.
    """
    from bitfit_hf.adapters.adapter import BitFitAdapter
    from bitfit_hf.reporting.bias_change_files import resolve_bias_change, write_bias_change_files
    from bitfit_hf.reporting.eval_results import read_eval_results
    from bitfit_hf.reporting.model_card import summary_from_adapter, write_model_card_files

    source_dir = str(adapter) if isinstance(adapter, (str, os.PathLike)) else None
    model_summary = None
    if source_dir is not None:
        adapter = BitFitAdapter.from_directory(source_dir)
    elif not isinstance(adapter, BitFitAdapter):
        from bitfit_hf.tuners.state import get_tuner_state

        state = get_tuner_state(adapter)
        model_summary = state.summary.to_dict() if state is not None else None
        adapter = BitFitAdapter.from_model(adapter)
    publish = publishable_adapter(adapter, base_model)
    change = resolve_bias_change(adapter, source_dir, base=base, bias_change=bias_change)
    with tempfile.TemporaryDirectory(prefix="bitfit-hub-push-") as stage:
        publish.save_pretrained(stage)
        canonicalize_safetensors(os.path.join(stage, WEIGHTS_NAME))
        stage_peft_copy(publish, stage, peft if peft is not None else (
            os.path.join(source_dir, PEFT_SUBFOLDER) if source_dir else None))
        summary = summary or (read_json_object(os.path.join(source_dir, SUMMARY_NAME)) if source_dir else None) or model_summary or summary_from_adapter(adapter)
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
                write_text_atomic(os.path.join(stage, README_NAME), redact_text(str(model_card)))
        return push_adapter_folder(stage, repo_id, token=token, private=private, revision=revision,
                                   commit_message=commit_message, commit_description=commit_description,
                                   create_pr=create_pr, manage_readme=model_card is not False)


def stage_peft_copy(adapter, stage: str, peft: Union[None, bool, str]) -> bool:
    """Put the adapter's PEFT BEFT copy into ``stage/peft``: copied from the folder ``peft`` (when it holds
    one), or exported now with ``peft=True``. Returns whether there is one."""
    target = os.path.join(stage, PEFT_SUBFOLDER)
    if peft is True:
        from bitfit_hf.adapters.peft_export import export_peft

        export_peft(adapter, target)
        return True
    if isinstance(peft, (str, os.PathLike)) and os.path.isfile(os.path.join(peft, CONFIG_NAME)):
        os.makedirs(target, exist_ok=True)
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            shutil.copyfile(os.path.join(peft, name), os.path.join(target, name))
        return True
    return False


def publishable_adapter(adapter, base_model: Optional[str] = None):
    """The adapter as it should appear on the Hub: without load-time metadata (``resolved_commit``),
    and with the base model's Hub id when it records only a local path (``base_model`` overrides)."""
    from bitfit_hf.adapters.adapter import BitFitAdapter
    from bitfit_hf.reporting.card_metadata import hub_base_model_id

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
    with hub_errors("push", repo_id, revision):
        if offline():
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


def checkpoint_files(repo_id: str, revision: Optional[str], token: Optional[str], local_files_only: bool = False) -> List[str]:
    """The safetensors file(s) of a Hub model, from the cache or downloaded (the remote store's hook
    for :func:`bitfit_hf.adapters.base_checkpoint.checkpoint_files`)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    from bitfit_hf.adapters.base_checkpoint import INDEX_NAME, SINGLE_NAME, shard_names

    kwargs = dict(revision=revision, token=token, local_files_only=local_files_only)
    try:
        index = hf_hub_download(repo_id, INDEX_NAME, **kwargs)
    except EntryNotFoundError:
        return [hf_hub_download(repo_id, SINGLE_NAME, **kwargs)]
    return [hf_hub_download(repo_id, shard, **kwargs) for shard in shard_names(index)]
