"""The download progress bar: bytes appearing in watched folders while another program runs."""

from __future__ import annotations

import sys
import textwrap

import pytest

from bitfit_hf.data import progress


class RecordingBar:
    """Stands in for tqdm: records the totals and positions it is given."""

    instances: list["RecordingBar"] = []

    def __init__(self, total=None, desc=None, disable=None, **kwargs):
        self.total, self.desc, self.disable, self.n, self.positions, self.closed = total, desc, disable, 0, [], False
        RecordingBar.instances.append(self)

    def update(self, amount):
        self.n += amount
        self.positions.append(self.n)

    def close(self):
        self.closed = True


@pytest.fixture
def bar(monkeypatch):
    RecordingBar.instances = []
    monkeypatch.setattr(progress, "tqdm", RecordingBar)
    return RecordingBar.instances


WRITER = """
import sys, time
path = sys.argv[1]
with open(path, "wb") as out:
    for _ in range(5):
        out.write(b"x" * 1000); out.flush(); time.sleep(0.3)
print("done"); sys.stderr.write("note")
raise SystemExit(int(sys.argv[2]))
"""


def test_bar_follows_the_file_and_output_is_captured(tmp_path, bar):
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER))
    watched = tmp_path / "dl"
    watched.mkdir()
    proc = progress.run_with_progress([sys.executable, str(script), str(watched / "f.bin"), "0"], [watched], 5000, "f")
    assert proc.returncode == 0 and proc.stdout.strip() == "done" and proc.stderr == "note"
    (only,) = bar
    assert only.total == 5000 and only.desc == "f" and only.closed
    assert only.positions == sorted(only.positions) and only.n == 5000
    assert any(0 < p < 5000 for p in only.positions)  # it moved while the file grew


def test_failed_program_leaves_the_bar_short(tmp_path, bar):
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER))
    proc = progress.run_with_progress([sys.executable, str(script), str(tmp_path / "f.bin"), "3"], [tmp_path], 10_000, "f")
    assert proc.returncode == 3
    assert bar[0].n <= 5000 and bar[0].closed


def test_progress_bars_can_be_switched_off(monkeypatch, tmp_path, bar):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    assert progress.progress_disabled()
    progress.run_with_progress([sys.executable, "-c", "pass"], [tmp_path], 10, "x")
    assert bar[0].disable is True
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    assert not progress.progress_disabled()
