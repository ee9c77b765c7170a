"""Run a recipe once per cell, each in a process of its own, and keep finished cells as resumable JSONL rows.

The study (``bitfit_hf.study.runner``) and the benchmarks that run ``recipes/glue.py`` once per cell
(``benchmarks/lr_sweep.py``, ``method_defaults.py``, ``time_to_accuracy.py``) all launch their cells here:

* :func:`run_recipe_cell` runs ``python <recipe>.py <flags> --output_dir <dir>``: a fresh process, so its memory
  peak is its own, read from outside with ``wait4``; on Linux it dies with its parent (``PR_SET_PDEATHSIG``), so a
  killed run never leaves a cell writing late. It returns a :class:`CellRun` (exit status, wall and CPU seconds,
  peak RSS, the end of the output); a failed cell raises :class:`CellFailed`, naming the cell and showing that end.
* :func:`run_cells` runs a list of cells one at a time or ``jobs`` at once; each finished cell is handed back in
  the calling thread as it ends, so its row is saved before the next one finishes.
* :func:`read_rows` / :func:`append_row`: one JSON line per finished cell, appended and synced as the cell ends, so
  an interrupted run loses at most the cells in progress and a second call skips the cells already there.

``python -m bitfit_hf.utils.cell_runs --cuda-peak JSON SCRIPT ARGS...`` is the in-process wrapper behind
``run_recipe_cell(cuda_peak=True)``: ``torch.cuda.max_memory_allocated`` can only be read inside the process that
trained, so the wrapper runs the recipe there and writes it (the CPU peak needs no wrapper).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from bitfit_hf.utils.errors import UserError

logger = logging.getLogger(__name__)

__all__ = [
    "RECIPES_ENV",
    "CellFailed",
    "CellRun",
    "RecipesNotFound",
    "append_row",
    "cores_per_job",
    "find_recipes_dir",
    "read_rows",
    "recipe_command",
    "run_cells",
    "run_recipe_cell",
]

RECIPES_ENV = "BITFIT_HF_RECIPES"
_MODULE = "bitfit_hf.utils.cell_runs"
#: How much of a cell's output a :class:`CellRun` keeps (and a :class:`CellFailed` shows).
TAIL_CHARS = 3000
#: How often a cell that may be stopped from another thread checks whether it should stop.
_POLL_SECONDS = 0.05

Cell = TypeVar("Cell")
Result = TypeVar("Result")


class RecipesNotFound(UserError, FileNotFoundError):
    """No recipes folder: neither given, nor in the source checkout, nor shipped in the installed package."""


@dataclass(frozen=True)
class CellRun:
    """One finished recipe process: what a caller records beside the recipe's own output files."""

    name: str
    command: Tuple[str, ...]
    returncode: int
    wall_s: float
    #: The cell's peak resident memory (``ru_maxrss`` from ``wait4``: its own, not the caller's; see ``_LAUNCHER``);
    #: None where ``wait4`` does not exist.
    peak_rss_mb: Optional[float]
    cpu_s: Optional[float]
    #: The last :data:`TAIL_CHARS` characters of its output (stdout and stderr together).
    tail: str
    #: ``torch.cuda.max_memory_allocated`` of the run, and the GPU's name (``cuda_peak=True`` on a GPU only).
    peak_cuda_mb: Optional[float] = None
    cuda_device: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def how(self) -> str:
        """How the process ended, in words: ``exit status 2``, ``killed by signal 9``."""
        code = self.returncode
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


class CellFailed(RuntimeError):
    """A cell's process ended with a non-zero status; the message names the cell and shows its output's end."""

    def __init__(self, run: CellRun):
        super().__init__(f"cell {run.name} failed ({run.how}); the end of its output:\n{run.tail}")
        self.run = run


# --------------------------------------------------------------------------- one cell


def find_recipes_dir(explicit: Optional[str] = None) -> str:
    """``explicit``, else ``$BITFIT_HF_RECIPES``, else the ``recipes/`` folder of the source checkout this package
    was imported from, else the recipes shipped inside the installed package (``bitfit_hf/recipes``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bitfit_hf/, from bitfit_hf/utils/
    candidates = [explicit, os.environ.get(RECIPES_ENV), os.path.join(os.path.dirname(package), "recipes"),
                  os.path.join(package, "recipes")]
    for folder in candidates:
        if folder and os.path.isfile(os.path.join(folder, "glue.py")):
            return os.path.abspath(folder)
    raise RecipesNotFound(
        "cannot find the recipes folder (recipes/glue.py, pos.py, squad.py): neither a source checkout nor the "
        f"installed package holds it; reinstall bitfit-hf, or set ${RECIPES_ENV} to a folder that holds them."
    )


def recipe_command(recipe: str, flags: Sequence[str], output_dir: str, python: Optional[str] = None,
                   recipes_dir: Optional[str] = None) -> List[str]:
    """``[python, <recipe script>, *flags, "--output_dir", output_dir]``. ``recipe`` is a script's path, or a
    recipe's name (``glue``) looked up in ``recipes_dir`` (default: :func:`find_recipes_dir`)."""
    if os.sep not in recipe and not recipe.endswith(".py"):
        recipe = os.path.join(recipes_dir or find_recipes_dir(), f"{recipe}.py")
    return [python or sys.executable, recipe, *flags, "--output_dir", output_dir]


def run_recipe_cell(
    recipe: str,
    flags: Sequence[str],
    output_dir: str,
    *,
    name: str,
    python: Optional[str] = None,
    recipes_dir: Optional[str] = None,
    threads: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    log_path: Optional[str] = None,
    cuda_peak: bool = False,
    stop: Optional[threading.Event] = None,
    check: bool = True,
) -> CellRun:
    """Run one cell: :func:`recipe_command` in a child process, and wait for it.

    ``threads`` sets the child's ``OMP_NUM_THREADS`` (torch's threads; None: inherited); ``env`` is added to this
    process's environment. The output (stdout and stderr) goes to ``log_path`` as it comes, after a ``$ command``
    line (None: a temporary file, removed afterwards); the :class:`CellRun` keeps its end. ``cuda_peak`` runs the
    recipe under this module's in-process wrapper, which reads the GPU's peak (``python`` must import bitfit_hf).

    ``stop`` (an event another thread sets, e.g. on Ctrl-C) kills the child and raises ``KeyboardInterrupt``: a
    stopped cell has no result. Ctrl-C in the waiting thread does the same. With ``check`` a non-zero exit raises
    :class:`CellFailed`; without it the caller reads ``run.ok``.
    """
    command = recipe_command(recipe, flags, output_dir, python, recipes_dir)
    temporary = []
    if cuda_peak:
        memory_path = _temporary_file(temporary, ".json")
        command = [command[0], "-m", _MODULE, "--cuda-peak", memory_path, *command[1:]]
    child_env = {**os.environ, **(env or {})}
    if threads is not None:
        child_env["OMP_NUM_THREADS"] = str(threads)
    if log_path is None:
        log_path = _temporary_file(temporary, ".log")
    measured = hasattr(os, "wait4") and hasattr(os, "fork")
    report_path = _temporary_file(temporary, ".txt") if measured else None
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            log.write("$ " + shlex.join(command) + "\n")
            log.flush()
            started = time.monotonic()
            launch = [sys.executable, "-S", "-c", _LAUNCHER, report_path, *command] if measured else command
            process = subprocess.Popen(launch, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=cwd,
                                       preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
            returncode = _wait(process, stop)
            wall = time.monotonic() - started
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt  # stopped from another thread: this cell has no result
        peak_rss_mb = cpu_s = None
        report = _read_text(report_path).split() if report_path else []
        if len(report) == 4:  # the launcher saw the cell end (else it died first: its own status stands)
            returncode, wall, cpu_s = int(report[0]), float(report[1]), float(report[3])
            scale = 1024 if sys.platform.startswith("linux") else 1  # ru_maxrss: KiB on Linux, bytes on macOS
            peak_rss_mb = int(report[2]) * scale / 2**20
        tail = _tail(log_path, TAIL_CHARS)
        try:
            cuda = json.loads(_read_text(memory_path) or "{}") if cuda_peak else {}
        except ValueError:  # the wrapper died while writing it
            cuda = {}
    finally:
        for path in temporary:
            os.remove(path)
    run = CellRun(name=name, command=tuple(command), returncode=returncode, wall_s=wall, peak_rss_mb=peak_rss_mb,
                  cpu_s=cpu_s, tail=tail, peak_cuda_mb=cuda.get("peak_cuda_mb"), cuda_device=cuda.get("device"))
    if check and not run.ok:
        raise CellFailed(run)
    return run


#: Starts the cell and reports its exit status, wall seconds, peak RSS and CPU seconds (``wait4``) to the file named
#: first. Linux counts in a child's peak the memory of the process it was forked from, so the cell is forked from
#: this small interpreter (stdlib only, ``-S``), not from the caller (which may hold torch and a model). Both die
#: with their parent (``PR_SET_PDEATHSIG``); Ctrl-C reaches the cell, not the launcher; SIGTERM to the launcher
#: kills the cell, and the launcher exits once it is gone.
_LAUNCHER = r"""
import os, signal, sys, time
report, command = sys.argv[1], sys.argv[2:]
launcher = os.getpid()
start = time.monotonic()
child = os.fork()
if child == 0:
    try:
        if sys.platform.startswith("linux"):
            import ctypes
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        if os.getppid() == launcher:
            os.execvp(command[0], command)
    except BaseException as err:
        os.write(2, f"cannot run {command[0]}: {err}\n".encode())
    os._exit(127)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
_, status, usage = os.wait4(child, 0)
wall = time.monotonic() - start
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(report, "w") as handle:
    handle.write(f"{os.waitstatus_to_exitcode(status)} {wall!r} {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime!r}")
"""


def _temporary_file(made: List[str], suffix: str) -> str:
    handle, path = tempfile.mkstemp(prefix="cell_", suffix=suffix)
    os.close(handle)
    made.append(path)
    return path


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to kill this child (the launcher) when the thread that started it dies, the whole process even by
    SIGKILL: its parent is that thread, so :func:`run_recipe_cell` waits for it in the thread that started it."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _wait(process: subprocess.Popen, stop: Optional[threading.Event]) -> int:
    """Wait for ``process``; returns its exit code. On Ctrl-C, or ``stop`` set by another thread, the cell is
    killed before this returns (the interrupt goes on)."""
    try:
        if stop is None:
            return process.wait()
        while True:  # another thread may stop it: poll
            code = process.poll()
            if code is not None:
                return code
            if stop.wait(_POLL_SECONDS):
                _kill(process)
    except BaseException:
        _kill(process)
        raise


def _kill(process: subprocess.Popen) -> None:
    """Kill the cell through its launcher (SIGTERM: it kills the cell and waits for it), then the launcher."""
    if process.returncode is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: str, chars: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 4 * chars))  # UTF-8: at most 4 bytes a character
        return handle.read().decode("utf-8", errors="replace")[-chars:]


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def cores_per_job(jobs: int) -> int:
    """An equal share of this process's cores (its CPU affinity) for each of ``jobs`` runs side by side."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, jobs))


# --------------------------------------------------------------------------- many cells


def run_cells(
    cells: Iterable[Cell],
    one: Callable[[Cell, Optional[threading.Event]], Result],
    *,
    jobs: int = 1,
    finished: Optional[Callable[[Cell, Result], None]] = None,
    running: Optional[Callable[[List[Cell]], None]] = None,
) -> None:
    """Call ``one(cell, stop)`` for every cell in order, ``jobs`` at a time (``stop``: None with one job, else the
    event to pass to :func:`run_recipe_cell`). ``finished(cell, result)`` gets each result in this thread as the
    cell ends (save it there: no lock needed); ``running(cells)`` the cells running, before each wait for one to end.

    A cell that raises stops the run: no further cell starts, the running ones finish (and are handed to
    ``finished``, so no work is thrown away), then the first error is raised. Ctrl-C kills the running children
    and goes on (no result of theirs is handed back)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    queue = list(cells)
    if jobs == 1:  # in this thread: Ctrl-C reaches the wait, and the child dies with this thread
        for cell in queue:
            if running is not None:
                running([cell])
            result = one(cell, None)
            if finished is not None:
                finished(cell, result)
        return
    stop = threading.Event()
    failure: Optional[BaseException] = None
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        active: Dict = {}
        try:
            while active or (queue and failure is None):
                while queue and failure is None and len(active) < jobs:
                    cell = queue.pop(0)
                    active[pool.submit(one, cell, stop)] = cell
                if running is not None:
                    running(list(active.values()))
                ready, _ = wait(active, return_when=FIRST_COMPLETED)
                for future in [f for f in active if f in ready]:  # in the order they started
                    cell = active.pop(future)
                    error = future.exception()
                    if error is not None:
                        failure = failure or error
                    elif finished is not None:
                        finished(cell, future.result())
        except BaseException:
            stop.set()  # each worker kills its child and raises
            raise
    if failure is not None:
        raise failure


# --------------------------------------------------------------------------- resumable rows


def read_rows(path: str, key: Callable[[dict], str]) -> Dict[str, dict]:
    """The finished cells of ``path`` by ``key(row)`` (a later line with the same key wins); {} if there is none.
    A line that is not JSON (the half-written last line of a killed run) is skipped with a warning: its cell runs
    again."""
    rows: Dict[str, dict] = {}
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                logger.warning("%s: line %d is not a whole JSON row (a run killed while writing it?); skipped, so "
                               "its cell runs again", path, number)
                continue
            rows[key(row)] = row
    return rows


def append_row(path: str, row: dict) -> None:
    """Append one finished cell as a JSON line, flushed and synced (on a line of its own, even after a half-written
    line that a killed run left)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a+b") as handle:
        handle.seek(0, os.SEEK_END)
        start = b""
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            start = b"" if handle.read(1) == b"\n" else b"\n"
        handle.write(start + (json.dumps(row, sort_keys=True) + "\n").encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


# --------------------------------------------------------------------------- the in-process wrapper


def _cuda_peak_child(argv: List[str]) -> int:
    """``--cuda-peak JSON SCRIPT ARGS...``: run SCRIPT here as ``python SCRIPT ARGS`` would, then write the GPU's
    peak to JSON (nothing when no GPU was used)."""
    import runpy

    memory_path, script, args = argv[0], argv[1], argv[2:]
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if isinstance(exit_.code, int) or exit_.code is None:
            status = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            status = 1
    finally:
        memory = {}
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            memory = {"peak_cuda_mb": torch.cuda.max_memory_allocated() / 2**20, "device": torch.cuda.get_device_name()}
        with open(memory_path, "w", encoding="utf-8") as handle:
            json.dump(memory, handle)
    return status


if __name__ == "__main__":
    if sys.argv[1:2] != ["--cuda-peak"] or len(sys.argv) < 4:
        sys.exit(f"usage: python -m {_MODULE} --cuda-peak JSON SCRIPT [ARGS...]")
    sys.exit(_cuda_peak_child(sys.argv[2:]))
