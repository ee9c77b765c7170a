"""The output folder of a run: never another run's, never replaced silently.

* :func:`check_output_dir` (every process, before anything is loaded): a folder that already holds files
  (an earlier run's adapter, checkpoints, results) is refused with one clear error unless
  ``--overwrite_output_dir`` is given or the run resumes (``--resume_from_checkpoint``). The lock and hidden
  files (a killed writer's temporary files) do not count.
* :func:`claim_output_dir` (the process that writes): ``<output_dir>/_bitfit_run.lock`` (a leading ``_``, so a
  full-model ``push_to_hub`` of the folder leaves it out, as transformers does ``_*`` files), created atomically
  (``O_CREAT | O_EXCL``) with the process id, host and start time. A folder whose lock names a live process
  is refused; a lock whose process is gone (same host, no such pid, or this very process after an earlier
  run in it) is taken over. :func:`release_output_dir` removes the lock at the end of the run (the recipes'
  ``finish_run``, the command-line entry on any exit, and at interpreter exit), and the folder too when the
  run created it and left nothing in it (a run that failed before writing).

A lock on another host cannot be checked from here: it is treated as live (the error says which file to
delete when that run is known to be gone).
"""

from __future__ import annotations

import atexit
import datetime
import errno
import json
import logging
import os
import socket
from typing import List, Optional

from bitfit_hf.recipe_kit.errors import RecipeError

logger = logging.getLogger(__name__)

__all__ = ["LOCK_NAME", "check_output_dir", "claim_output_dir", "release_output_dir", "earlier_outputs"]

LOCK_NAME = "_bitfit_run.lock"
_SHOWN = 4


def earlier_outputs(folder: str) -> List[str]:
    """The entries of ``folder`` that an earlier run (or anyone) left there, hidden files aside; ``[]`` when
    the folder is empty or does not exist."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if not n.startswith(".") and n != LOCK_NAME)


def _resumes(training_args) -> bool:
    value = getattr(training_args, "resume_from_checkpoint", None)
    return value not in (None, False, "") and str(value).lower() not in ("false", "no", "0")


def check_output_dir(training_args) -> None:
    """Refuse an ``--output_dir`` that holds an earlier run's files (see the module docstring)."""
    folder = os.path.expanduser(training_args.output_dir)
    if getattr(training_args, "overwrite_output_dir", False) or _resumes(training_args):
        return
    found = earlier_outputs(folder)
    if found:
        shown = ", ".join(found[:_SHOWN]) + (f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else "")
        raise RecipeError(
            f"--output_dir {training_args.output_dir!r} already holds an earlier run's files ({shown}); this run "
            "would replace them. Pass --overwrite_output_dir to write over them, --resume_from_checkpoint last to "
            "continue that run, or pick another --output_dir."
        )


class _Claim:
    """The lock this process holds, and the folders it created to hold it."""

    def __init__(self, folder: str, path: str, created: List[str], token: dict):
        self.folder, self.path, self.created, self.token = folder, path, created, token


_HELD: Optional[_Claim] = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError as err:
        return err.errno != errno.ESRCH
    return True


def _read_lock(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # being written, or damaged: no pid to check


def _is_stale(holder: dict) -> bool:
    pid, host = holder.get("pid"), holder.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return False  # cannot tell: treated as live
    return pid == os.getpid() or not _alive(pid)


def _make_folder(folder: str) -> List[str]:
    """``os.makedirs(folder)``; returns the folders it created, deepest first."""
    created, current = [], folder
    while not os.path.isdir(current):
        created.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    os.makedirs(folder, exist_ok=True)
    return created


def claim_output_dir(training_args) -> None:
    """Take ``<output_dir>/_bitfit_run.lock`` for this run (only on the process that saves); refuse a folder
    that another live run holds."""
    global _HELD
    if not getattr(training_args, "should_save", True):
        return
    folder = os.path.abspath(os.path.expanduser(training_args.output_dir))
    if _HELD is not None:
        release_output_dir()  # an earlier run in this process that did not end through finish_run
    path = os.path.join(folder, LOCK_NAME)
    token = {"pid": os.getpid(), "host": socket.gethostname(),
             "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    holder = _read_lock(path)
    if holder is not None and not _is_stale(holder):
        _refuse(training_args.output_dir, path, holder)
    created = _make_folder(folder)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read_lock(path)
            if holder is not None and not _is_stale(holder):
                _remove_created(created)
                _refuse(training_args.output_dir, path, holder)
            if holder is not None:
                logger.warning("Taking over %s: the run that held it (pid %s, started %s) is gone.", path,
                               holder.get("pid"), holder.get("started"))
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(token, handle)
        _HELD = _Claim(folder, path, created, token)
        return
    raise RecipeError(f"--output_dir {training_args.output_dir!r}: could not take {path} (another run keeps taking it).")


def _refuse(shown: str, path: str, holder: dict) -> None:
    raise RecipeError(
        f"--output_dir {shown!r} is in use by another run (pid {holder.get('pid', '?')} on "
        f"{holder.get('host', '?')}, started {holder.get('started', '?')}; it holds {path}). Wait for it to end or "
        f"pick another --output_dir; if that run is gone, delete {path}."
    )


def _remove_created(created: List[str]) -> None:
    """Remove the folders the claim created, deepest first, while they are empty."""
    for folder in created:
        try:
            os.rmdir(folder)
        except OSError:
            break


def release_output_dir() -> None:
    """Remove this process's lock (if it is still ours), and the folder when the run created it and left it
    empty. Safe to call more than once."""
    global _HELD
    claim, _HELD = _HELD, None
    if claim is None or claim.token["pid"] != os.getpid():  # a forked worker never releases its parent's lock
        return
    if _read_lock(claim.path) == claim.token:
        try:
            os.remove(claim.path)
        except FileNotFoundError:
            pass
    _remove_created(claim.created)


atexit.register(release_output_dir)
