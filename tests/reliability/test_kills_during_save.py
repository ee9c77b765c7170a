"""A save killed at any moment leaves a loadable adapter; what the kill leaves behind (hidden temporary
files, an adapter_config.json newer than the weights) is cleaned up; files get the user's umask."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
from reliability_support import make_adapter, python_env, same_tensors

from bitfit_hf import BitFitAdapter
from bitfit_hf.utils import io
from bitfit_hf.utils.constants import CONFIG_NAME, WEIGHTS_NAME
from bitfit_hf.utils.io import write_json_atomic, write_text_atomic


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def leftover(folder, name: str, pid: int) -> str:
    """The temporary file a writer killed before its rename leaves (same naming as utils.io)."""
    path = os.path.join(folder, f".{name}.{io._host()}-{pid}.k1ll3d00.tmp")
    with open(path, "wb") as handle:
        handle.write(b"half a file")
    return path


def test_temp_files_of_a_killed_save_are_removed_by_the_next_save(tmp_path):
    _, adapter_dir, tensors = make_adapter(tmp_path)
    pid = dead_pid()
    stale = [leftover(adapter_dir, WEIGHTS_NAME, pid), leftover(adapter_dir, CONFIG_NAME, pid)]
    BitFitAdapter.from_pretrained(str(adapter_dir)).save_pretrained(str(adapter_dir))
    assert not any(os.path.exists(p) for p in stale)
    assert sorted(n for n in os.listdir(adapter_dir) if n.endswith(".tmp")) == []
    assert same_tensors(BitFitAdapter.from_pretrained(str(adapter_dir)).tensors, tensors)


def test_temp_files_of_a_live_writer_are_left_alone(tmp_path):
    live = leftover(tmp_path, "x.json", os.getpid())  # this process is alive: a concurrent write in flight
    write_json_atomic(str(tmp_path / "y.json"), {"a": 1})
    assert os.path.exists(live)
    old = time.time() - io.STALE_TEMP_SECONDS - 60  # ... unless it is older than any write takes
    os.utime(live, (old, old))
    write_json_atomic(str(tmp_path / "y.json"), {"a": 2})
    assert not os.path.exists(live)


def test_a_config_newer_than_the_weights_never_wins_and_the_next_save_rewrites_it(tmp_path):
    """Killed between the two renames of a save: adapter_config.json is the new one, the weights (and
    the config they embed) the old ones. A load uses the embedded config and leaves the file (a read never
    writes: tests/reliability/test_loads_never_write.py); the next save writes both again."""
    _, adapter_dir, tensors = make_adapter(tmp_path)
    embedded = json.loads((adapter_dir / CONFIG_NAME).read_text())
    newer = dict(embedded, adapter_parameters=embedded["adapter_parameters"][:-1], metadata={"run": "newer"})
    write_text_atomic(str(adapter_dir / CONFIG_NAME), json.dumps(newer))
    loaded = BitFitAdapter.from_pretrained(str(adapter_dir))
    assert same_tensors(loaded.tensors, tensors) and loaded.config.metadata == embedded["metadata"]
    assert json.loads((adapter_dir / CONFIG_NAME).read_text()) == newer  # left as it was
    loaded.save_pretrained(str(adapter_dir))
    assert json.loads((adapter_dir / CONFIG_NAME).read_text()) == embedded


def test_a_broken_config_beside_self_describing_weights_is_ignored(tmp_path):
    _, adapter_dir, tensors = make_adapter(tmp_path)
    good = (adapter_dir / CONFIG_NAME).read_text()
    (adapter_dir / CONFIG_NAME).write_text('{"half": ')
    loaded = BitFitAdapter.from_pretrained(str(adapter_dir))
    assert same_tensors(loaded.tensors, tensors)
    assert (adapter_dir / CONFIG_NAME).read_text() == '{"half": '
    loaded.save_pretrained(str(adapter_dir))
    assert json.loads((adapter_dir / CONFIG_NAME).read_text()) == json.loads(good)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        write_json_atomic(str(tmp_path / "a.json"), {"a": 1})
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(previous)
    mode = stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE(os.stat(plain).st_mode)


SAVE_LOOP = """
import sys, torch
from bitfit_hf import BitFitAdapter
adapter = BitFitAdapter.from_pretrained(sys.argv[1])
print("ready", flush=True)
step = adapter.config.metadata.get("step", 0)  # tensors of save `step` = the first ones + step
while True:
    step += 1
    adapter.tensors = {k: v + 1 for k, v in adapter.tensors.items()}  # every save differs
    adapter.config.metadata = {"step": step}
    adapter.save_pretrained(sys.argv[1])
"""


@pytest.mark.slow
def test_sigkill_at_random_moments_of_repeated_saves(tmp_path):
    """The probe of the issue, as a test: SIGKILL a process that saves in a loop, several times; after
    every kill the adapter loads with weights and config from the same save, and the next save
    removes the leftovers."""
    import random

    _, adapter_dir, first = make_adapter(tmp_path)
    rng = random.Random(17)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", SAVE_LOOP, str(adapter_dir)], env=python_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        loaded = BitFitAdapter.from_pretrained(str(adapter_dir))  # hash-checked: a mix would be refused
        expected = first
        for _ in range(loaded.config.metadata.get("step", 0)):  # the config's save wrote exactly these tensors
            expected = {k: v + 1 for k, v in expected.items()}
        assert same_tensors(loaded.tensors, expected)
        # A kill between the save's two renames leaves the side file one save ahead of the weights; the load
        # uses the config embedded in the weights and leaves the folder alone (loads never write).
        side = json.loads((adapter_dir / CONFIG_NAME).read_text())["metadata"]
        step = loaded.config.metadata.get("step", 0)
        assert side == loaded.config.metadata or side.get("step") == step + 1, (side, loaded.config.metadata)
    BitFitAdapter.from_pretrained(str(adapter_dir)).save_pretrained(str(adapter_dir))
    assert [n for n in os.listdir(adapter_dir) if n.endswith(".tmp")] == []
    resaved = BitFitAdapter.from_pretrained(str(adapter_dir))
    assert json.loads((adapter_dir / CONFIG_NAME).read_text())["metadata"] == resaved.config.metadata

