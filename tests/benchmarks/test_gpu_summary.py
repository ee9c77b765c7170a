"""benchmarks/gpu_summary.py keeps running: its rows on a tiny model on the CPU (--smoke; the figures mean
nothing there), the summary written with every key the GPU run publishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

KEYS = {"device", "date", "versions", "bitfit_samples_s", "bitfit_fast_samples_s", "full_samples_s",
        "full_fast_samples_s", "lora_samples_s", "bitfit_lora_samples_s", "ceiling_bitfit_samples_s",
        "bitfit_fast_tflops", "serve_rps_1", "serve_rps_64"}


def test_smoke_rows_and_summary(tmp_path):
    out = tmp_path / "gpu-summary.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_summary.py"), "--smoke", "--no-serve",
                           "--rows", "bitfit,bitfit-fast-stock,full", "--steps", "2", "--warmup", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert KEYS <= set(record["summary"])
    for row in ("bitfit", "bitfit-fast-stock", "full"):
        assert "error" not in record["rows"][row], record["rows"][row]
        assert record["rows"][row]["samples_s"] > 0
    assert record["summary"]["bitfit_samples_s"] == record["rows"]["bitfit"]["samples_s"]


def test_without_a_gpu_it_says_so(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_summary.py"), "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode != 0 and "found none" in proc.stderr
    assert not (tmp_path / "x.json").exists()
