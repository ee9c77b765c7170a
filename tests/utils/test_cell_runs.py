"""One recipe cell in a process of its own, many cells side by side, and the resumable JSONL rows: real child
processes (small Python scripts standing in for a recipe), real files."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time

import pytest

from bitfit_hf.utils import cell_runs
from bitfit_hf.utils.cell_runs import (
    CellFailed,
    append_row,
    read_rows,
    recipe_command,
    run_cells,
    run_recipe_cell,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="wait4 and PR_SET_PDEATHSIG: Linux")


def script(tmp_path, name, body):
    """A stand-in recipe: ``body`` runs with ``args`` (its flags) and ``out`` (its --output_dir) set."""
    path = tmp_path / f"{name}.py"
    path.write_text("import json, os, sys, time\nargs = sys.argv[1:]\nout = args[args.index('--output_dir') + 1]\n"
                    + body)
    return str(path)


@linux_only
def test_a_cell_reports_its_own_peak_memory_time_and_environment(tmp_path):
    big = script(tmp_path, "big", "block = b'x' * (200 * 2**20)\n"
                 "json.dump({'omp': os.environ.get('OMP_NUM_THREADS'), 'mine': os.environ.get('MINE'), "
                 "'cwd': os.getcwd(), 'flags': args}, open(os.path.join(out, 'seen.json'), 'w'))\n")
    small = script(tmp_path, "small", "pass\n")
    out = tmp_path / "out"
    out.mkdir()
    run = run_recipe_cell(big, ["--seed", "3"], str(out), name="big cell", threads=3, env={"MINE": "yes"},
                          cwd=str(tmp_path))
    assert run.ok and run.returncode == 0 and run.how == "exit status 0"
    assert run.peak_rss_mb > 200  # the child's peak, read from outside: 200 MiB allocated
    assert run.wall_s > 0 and run.cpu_s > 0 and run.peak_cuda_mb is None
    seen = json.loads((out / "seen.json").read_text())
    assert seen == {"omp": "3", "mine": "yes", "cwd": str(tmp_path), "flags": ["--seed", "3", "--output_dir", str(out)]}
    assert run.command == (sys.executable, big, "--seed", "3", "--output_dir", str(out))
    ballast = b"z" * (300 * 2**20)  # the caller's memory is not the cell's (Linux would count it in a forked child)
    assert run_recipe_cell(small, [], str(out), name="small cell").peak_rss_mb < 100 and len(ballast)


def test_a_failed_cell_names_itself_and_shows_the_end_of_its_output(tmp_path):
    failing = script(tmp_path, "failing", "for i in range(2000):\n    print('line', i)\n"
                     "print('glue.py: error: a flag the user must fix', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(CellFailed) as failed:
        run_recipe_cell(failing, [], str(tmp_path), name="bitfit lr=0.003 seed=0")
    message = str(failed.value)
    assert message.startswith("cell bitfit lr=0.003 seed=0 failed (exit status 3)")
    assert message.rstrip().endswith("glue.py: error: a flag the user must fix") and "line 1999" in message
    assert "line 0\n" not in message  # only the end: the tail is bounded
    assert len(failed.value.run.tail) <= cell_runs.TAIL_CHARS
    run = run_recipe_cell(failing, [], str(tmp_path), name="unchecked", check=False)  # the caller reads run.ok
    assert not run.ok and run.returncode == 3
    killed = script(tmp_path, "killed", "os.kill(os.getpid(), 9)\n")
    assert run_recipe_cell(killed, [], str(tmp_path), name="k", check=False).how == "killed by signal 9"


def test_a_log_keeps_the_command_and_the_output_and_a_recipe_is_found_by_name(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    script(recipes, "glue", "print('training', args[0])\n")
    log = tmp_path / "cell.log"
    run = run_recipe_cell("glue", ["--method", "bitfit"], str(tmp_path / "out"), name="named", recipes_dir=str(recipes),
                          log_path=str(log))
    lines = log.read_text().splitlines()
    assert lines[0] == f"$ {sys.executable} {recipes / 'glue.py'} --method bitfit --output_dir {tmp_path / 'out'}"
    assert lines[1] == "training --method" and run.tail == log.read_text()
    assert recipe_command("glue", [], "o", "py", str(recipes)) == ["py", str(recipes / "glue.py"), "--output_dir", "o"]
    assert recipe_command("/x/pos.py", ["-a"], "o", "py") == ["py", "/x/pos.py", "-a", "--output_dir", "o"]


def test_the_cuda_wrapper_runs_the_recipe_as_its_own_main_and_keeps_its_exit_status(tmp_path):
    """On a CPU the wrapper reports no GPU peak; the script still sees itself as ``__main__`` with its own argv."""
    wrapped = script(tmp_path, "wrapped", "json.dump({'name': __name__, 'argv0': sys.argv[0], 'path0': sys.path[0]}, "
                     "open(os.path.join(out, 'seen.json'), 'w'))\nsys.exit(4)\n")
    run = run_recipe_cell(wrapped, [], str(tmp_path), name="wrapped", cuda_peak=True, check=False)
    assert run.returncode == 4, run.tail
    assert json.loads((tmp_path / "seen.json").read_text()) == {"name": "__main__", "argv0": wrapped,
                                                               "path0": str(tmp_path)}
    assert run.command[1:4] == ("-m", "bitfit_hf.utils.cell_runs", "--cuda-peak")
    assert run.peak_cuda_mb is None and run.cuda_device is None


#: Holds a lock on ``<out>/lock`` while it lives (a process's locks go with it, zombie or not), then says it started.
SLEEPER = ("import fcntl\nlock = open(os.path.join(out, 'lock'), 'w')\nfcntl.flock(lock, fcntl.LOCK_EX)\n"
           "open(os.path.join(out, 'started'), 'w').close()\ntime.sleep(120)\n")


@linux_only
def test_the_cell_dies_with_the_process_that_runs_it(tmp_path):
    sleeper = script(tmp_path, "sleeper", SLEEPER)
    parent = subprocess.Popen([sys.executable, "-c", "import sys; from bitfit_hf.utils.cell_runs import "
                               "run_recipe_cell; run_recipe_cell(sys.argv[1], [], sys.argv[2], name='s')",
                               sleeper, str(tmp_path)])
    try:
        _wait_for_start(tmp_path, parent.poll)
        parent.send_signal(signal.SIGKILL)  # no chance to clean up
        parent.wait(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
    deadline = time.time() + 30
    while not _gone(tmp_path):
        assert time.time() < deadline, "the cell outlived the process that ran it"
        time.sleep(0.1)


def test_a_stopped_cell_is_killed_and_has_no_result(tmp_path):
    sleeper = script(tmp_path, "sleeper", SLEEPER)
    stop = threading.Event()
    raised = []

    def worker():
        try:
            run_recipe_cell(sleeper, [], str(tmp_path), name="s", stop=stop)
        except BaseException as err:  # noqa: BLE001 - what the worker raised is the point
            raised.append(err)

    thread = threading.Thread(target=worker)
    thread.start()
    _wait_for_start(tmp_path, lambda: None)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt)
    assert _gone(tmp_path)  # already gone when the call returns


RENDEZVOUS = ("meeting = os.path.join(os.path.dirname(out), 'meeting')\nos.makedirs(meeting, exist_ok=True)\n"
              "open(os.path.join(meeting, os.path.basename(out)), 'w').close()\ndeadline = time.time() + 60\n"
              "while len(os.listdir(meeting)) < 2:\n"
              "    if time.time() > deadline:\n        sys.exit('no other cell ran beside this one')\n"
              "    time.sleep(0.05)\n")


def test_jobs_run_every_cell_side_by_side_and_hand_each_back_in_this_thread(tmp_path):
    meet = script(tmp_path, "meet", RENDEZVOUS)  # one at a time, each would wait for a second in vain
    cells = ["a", "b", "c", "d"]
    finished, shown = [], []

    def one(cell, stop):
        assert stop is not None and threading.current_thread() is not threading.main_thread()
        return run_recipe_cell(meet, [], str(tmp_path / "runs" / cell), name=cell, stop=stop)

    run_cells(cells, one, jobs=2, finished=lambda cell, run: finished.append((cell, run.ok,
                                                                             threading.current_thread())),
              running=lambda running: shown.append(list(running)))
    assert sorted(cell for cell, _, _ in finished) == cells
    assert all(ok and thread is threading.main_thread() for _, ok, thread in finished)
    assert ["a", "b"] in shown and all(len(running) <= 2 for running in shown)


def test_a_failed_cell_stops_the_run_but_the_running_ones_finish():
    started, finished = [], []

    def one(cell, stop):
        started.append(cell)
        if cell == "bad":
            raise CellFailed(cell_runs.CellRun("bad", (), 2, 0.0, None, None, "error: bad"))
        time.sleep(0.3)
        return cell

    with pytest.raises(CellFailed, match="cell bad failed"):
        run_cells(["bad", "slow", "never"], one, jobs=2, finished=lambda cell, result: finished.append(result))
    assert sorted(started) == ["bad", "slow"] and finished == ["slow"]  # "slow" was running: kept; "never" never ran
    started.clear()
    with pytest.raises(CellFailed):
        run_cells(["bad", "never"], one, jobs=1)
    assert started == ["bad"]
    with pytest.raises(ValueError, match="jobs"):
        run_cells([], one, jobs=0)


def test_rows_resume_later_lines_win_and_a_half_written_line_is_skipped(tmp_path, caplog):
    path = str(tmp_path / "results" / "rows.jsonl")
    key = lambda row: f"{row['method']}|{row['seed']}"  # noqa: E731
    assert read_rows(path, key) == {}
    append_row(path, {"method": "bitfit", "seed": 0, "accuracy": 0.8})
    append_row(path, {"method": "lora", "seed": 0, "accuracy": 0.7})
    append_row(path, {"method": "bitfit", "seed": 0, "accuracy": 0.9})  # the same cell run again: the later wins
    rows = read_rows(path, key)
    assert set(rows) == {"bitfit|0", "lora|0"} and rows["bitfit|0"]["accuracy"] == 0.9
    with open(path, "a", encoding="utf-8") as handle:  # a run killed while writing its row
        handle.write('{"method": "full", "se')
    with caplog.at_level(logging.WARNING, logger=cell_runs.__name__):
        assert set(read_rows(path, key)) == {"bitfit|0", "lora|0"}
    assert "line 4 is not a whole JSON row" in caplog.text
    append_row(path, {"method": "full", "seed": 0, "accuracy": 0.95})  # the resumed run's row: a line of its own
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=cell_runs.__name__):
        rows = read_rows(path, key)
    assert rows["full|0"]["accuracy"] == 0.95 and "line 4" in caplog.text
    with open(path, encoding="utf-8") as handle:
        assert handle.read().splitlines()[-1] == json.dumps({"accuracy": 0.95, "method": "full", "seed": 0})


def _wait_for_start(out, exited):
    deadline = time.time() + 60
    while not (out / "started").exists():
        assert time.time() < deadline and exited() is None, "the cell did not start"
        time.sleep(0.05)


def _gone(out):
    """Whether the stand-in cell has ended: its lock is free."""
    import fcntl

    with open(out / "lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
