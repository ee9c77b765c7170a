"""benchmarks/probe_l2.py end to end on the real default model: one value, its dev accuracy recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_one_value_is_fitted_and_scored_on_the_dev_split(tmp_path):
    results = tmp_path / "probe_l2.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "probe_l2.py"), "--values", "1e-3,1",
                           "--results", str(results)], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(results.read_text())
    scores = record["dev_accuracy"]
    assert set(scores) == {"0.001", "1"} and record["dev"] == 1000
    assert 0.6 < scores["0.001"] < 0.95  # the majority class of the dev split is 53%
    assert scores["1"] < scores["0.001"]  # a penalty that large leaves the probe near the prior
