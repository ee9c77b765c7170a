"""The Hub's failures as :class:`HubError` subclasses whose messages say what went wrong and how to fix
it, instead of a traceback from inside ``huggingface_hub`` or the HTTP client."""

from __future__ import annotations

import errno
from contextlib import contextmanager
from typing import Iterator, Optional

from bitfit_hf.utils.constants import WEIGHTS_NAME
from bitfit_hf.utils.errors import UserError

AUTH_HINT = "pass token=..., set HF_TOKEN, or run `hf auth login`"


class HubError(UserError, OSError):
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


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def translate(err: BaseException, action: str, repo_id: str, revision: Optional[str],
              local_files_only: bool = False) -> Optional[HubError]:
    """A :class:`HubError` for a ``huggingface_hub`` / network exception, or ``None`` to re-raise it."""
    from huggingface_hub import errors as hf

    if isinstance(err, hf.HFValidationError):
        return HubError(
            f"{repo_id!r} is neither a local adapter directory nor a valid Hub repo id ('namespace/name'): "
            f"check the path or the id ({err})."
        )
    if isinstance(err, (hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled)):
        return _not_in_cache(err, action, repo_id, revision, local_files_only)
    by_type = _by_exception_type(err, action, repo_id, revision)
    if by_type is not None:
        return by_type
    status = _status(err)
    if status is not None and status >= 400:
        return _by_status(err, status, action, repo_id, revision)
    if _is_connection_error(err):
        hint = "" if action == "push" else " Once an adapter has been downloaded, HF_HUB_OFFLINE=1 loads it from the cache."
        return HubConnectionError(
            f"Cannot reach the Hub at {_endpoint()} to {action} {_where(repo_id, revision)} ({type(err).__name__}): "
            f"check your network, proxy and HF_ENDPOINT.{hint}"
        )
    return None


def _where(repo_id: str, revision: Optional[str]) -> str:
    return repo_id + (f"@{revision}" if revision else "")


def _not_in_cache(err, action: str, repo_id: str, revision: Optional[str], local_files_only: bool) -> HubError:
    """A file is neither in the cache nor downloadable: offline by choice, or the Hub out of reach."""
    from huggingface_hub import errors as hf

    where = _where(repo_id, revision)
    is_offline = local_files_only or offline()
    cause = err.__cause__ or err.__context__
    if cause is not None and not isinstance(cause, (hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled)) and not is_offline:
        inner = translate(cause, action, repo_id, revision)
        if inner is not None:
            return inner
    if is_offline:
        flag = "local_files_only=True" if local_files_only else "HF_HUB_OFFLINE=1"
        if action == "push":
            return HubOfflineError(f"Cannot {action} {where}: {flag} is set and pushing needs the network. Unset it.")
        return HubOfflineError(
            f"{where} is not in the local Hub cache and {flag} forbids downloading it. Download it once "
            "online (the same call without offline mode), or pin a revision that was downloaded before "
            "(a branch or tag resolves through the cache's refs; a commit hash always works)."
        )
    return HubConnectionError(
        f"Cannot reach the Hub at {_endpoint()} to {action} {where}, and it is not in the local cache. Check "
        "your network, proxy and HF_ENDPOINT; once an adapter has been downloaded, HF_HUB_OFFLINE=1 loads it "
        "from the cache."
    )


def _by_exception_type(err, action: str, repo_id: str, revision: Optional[str]) -> Optional[HubError]:
    """Errors ``huggingface_hub`` names by class: gated, missing repo, revision or file."""
    from huggingface_hub import errors as hf

    endpoint = _endpoint()
    if isinstance(err, hf.GatedRepoError):
        return HubAuthError(
            f"{repo_id} is a gated repo and this request is not allowed in: request access on "
            f"{endpoint}/{repo_id}, then authenticate ({AUTH_HINT}).{_server_says(err)}"
        )
    if isinstance(err, hf.RepositoryNotFoundError):
        if action == "push":
            return HubRepoNotFoundError(
                f"Cannot push to {repo_id}: it does not exist and could not be created, or the token cannot see "
                f"it. Check the repo id and that the token has write access to the namespace ({AUTH_HINT})."
                f"{_server_says(err)}"
            )
        return HubRepoNotFoundError(
            f"No repo {repo_id!r} on {endpoint}: check the id ('namespace/name'). If it is private, "
            f"authenticate ({AUTH_HINT}).{_server_says(err)}"
        )
    if isinstance(err, hf.RevisionNotFoundError):
        return HubRevisionNotFoundError(
            f"{repo_id} has no revision {revision!r} (a branch, tag or commit hash). "
            f"{_refs_hint(repo_id)}{_server_says(err)}"
        )
    if isinstance(err, hf.RemoteEntryNotFoundError):
        return HubAdapterNotFoundError(
            f"{_where(repo_id, revision)} holds no {WEIGHTS_NAME}: it is not a BitFit adapter repo (a full model? "
            "a PEFT adapter?), or the adapter lives in a subfolder (pass subfolder=...)."
        )
    return None


def _by_status(err, status: int, action: str, repo_id: str, revision: Optional[str]) -> HubError:
    """Errors known only by their HTTP status (400 and above)."""
    endpoint, where = _endpoint(), _where(repo_id, revision)
    if status == 401:
        return HubAuthError(
            f"The Hub at {endpoint} refused the credentials while trying to {action} {where} (401): the token is "
            f"missing, invalid or expired; {AUTH_HINT}.{_server_says(err)}"
        )
    if status == 403:
        need = "write" if action == "push" else "read"
        return HubAuthError(
            f"Access denied (403) while trying to {action} {where}: the token lacks {need} permission for this "
            f"repo or namespace. Use a token with {need} access (fine-grained tokens need it per repo/org)."
            f"{_server_says(err)}"
        )
    if status == 412:
        return HubConflictError(
            f"{where} changed while pushing (another commit landed first); nothing was committed. Push again."
        )
    if status >= 500:
        return HubConnectionError(
            f"The Hub at {endpoint} failed with HTTP {status} while trying to {action} {where}; nothing was "
            f"changed. Try again later.{_server_says(err)}"
        )
    return HubError(f"The Hub refused to {action} {where} (HTTP {status}).{_server_says(err)}")


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
def hub_errors(action: str, repo_id: str, revision: Optional[str] = None, local_files_only: bool = False) -> Iterator[None]:
    try:
        yield
    except HubError:
        raise
    except Exception as err:  # noqa: BLE001 - translated or re-raised unchanged
        translated = translate(err, action, repo_id, revision, local_files_only)
        if translated is None:
            raise
        translated.original = err
        raise translated from None
