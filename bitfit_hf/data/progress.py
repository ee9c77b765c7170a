"""A progress bar for a download done by another program (``pip download``).

pip draws its own bar only on a terminal and only at its chattiest log level.  The assets are
fetched by pip all the same (its index, proxy and certificate settings apply), with its output
captured, while this module draws one quiet bar by watching the bytes appear in the folders pip
writes to: its temporary folder (``TMPDIR``, private to the child) and the destination folder.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from tqdm.auto import tqdm

__all__ = ["progress_disabled", "run_with_progress"]

_POLL_SECONDS = 0.2
_TRUE = {"1", "ON", "YES", "TRUE"}


def progress_disabled() -> bool:
    """``HF_HUB_DISABLE_PROGRESS_BARS`` (the Hugging Face switch) or ``BITFIT_HF_DISABLE_PROGRESS_BARS`` set."""
    return any(
        os.environ.get(name, "").strip().upper() in _TRUE
        for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "BITFIT_HF_DISABLE_PROGRESS_BARS")
    )


def _largest_file(folders: Sequence[Path]) -> int:
    """Size of the largest file under ``folders`` (the archive being written); 0 when none."""
    largest = 0
    for folder in folders:
        for root, _dirs, files in os.walk(folder):
            for name in files:
                try:
                    largest = max(largest, os.stat(os.path.join(root, name)).st_size)
                except OSError:  # renamed or removed while we looked
                    continue
    return largest


def run_with_progress(
    cmd: Sequence[str],
    watch: Sequence[Path],
    total: int,
    desc: str,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``cmd`` with its output captured, drawing a byte bar out of ``total`` meanwhile.

    ``watch`` are the folders the download lands in (they must exist).  Returns the completed
    process with ``stdout`` and ``stderr`` as text, like ``subprocess.run(..., capture_output=True)``.

    Raises:
        OSError: the program could not be started.
    """
    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env) if env else None
    )
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=progress_disabled() or None)
    try:
        # communicate() in a loop with a timeout drains both pipes, so a chatty pip never blocks.
        while True:
            try:
                out, err = proc.communicate(timeout=_POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                bar.update(max(0, min(total, _largest_file(watch)) - bar.n))
        if proc.returncode == 0:
            bar.update(max(0, total - bar.n))
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        bar.close()
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
