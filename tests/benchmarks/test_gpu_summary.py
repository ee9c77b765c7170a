"""benchmarks/gpu_summary.py keeps running: its rows on a tiny model on the CPU (--smoke; the figures mean
nothing there), the summary written with every key the GPU run publishes, and --preflight passing where the GPU
machine's packages are all there is (no datasets, evaluate or serving stack installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_summary.py"
pytestmark = pytest.mark.slow

KEYS = {"device", "date", "versions", "bitfit_samples_s", "bitfit_fast_samples_s", "full_samples_s",
        "full_fast_samples_s", "lora_samples_s", "bitfit_lora_samples_s", "ceiling_bitfit_samples_s",
        "bitfit_fast_tflops", "serve_rps_1", "serve_rps_64", "trainer_checks_passed"}
#: What the GPU machine lacks: datasets and evaluate, the serving stack (fastapi and what it brings), and DeepSpeed
#: (which needs pydantic; accelerate imports it where it is installed).
HIDDEN = ["datasets", "evaluate", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic_core", "deepspeed"]
#: A sitecustomize that makes them unimportable in every process started with it on PYTHONPATH (the script's
#: children inherit it), except where a folder on PYTHONPATH holds them: the script's own install of the wheels.
HIDER = """import os, sys
_extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
for _name in {names!r}:
    if not any(os.path.isdir(os.path.join(p, _name)) for p in _extra):
        sys.modules[_name] = None
"""


def test_smoke_rows_and_summary(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--no-serve", "--rows",
                           "bitfit,bitfit-fast-stock,full,real-text", "--steps", "2", "--warmup", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "gpu-summary.json").read_text())
    assert KEYS <= set(record["summary"])
    for row in ("bitfit", "bitfit-fast-stock", "full", "real-text"):
        assert "error" not in record["rows"][row], record["rows"][row]
        assert record["rows"][row]["samples_s"] > 0
    assert record["summary"]["bitfit_samples_s"] == record["rows"]["bitfit"]["samples_s"]
    real = record["rows"]["real-text"]
    assert real["unwarmed_buckets_timed"] == [] and real["graphs_compiled_in_window"] == 0, real
    assert all(row["frozen_dtype"].startswith("float32") for row in record["rows"].values())


def test_without_a_gpu_it_says_so(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode != 0 and "found none" in proc.stderr
    assert not (tmp_path / "gpu-summary.json").exists()


def test_preflight_passes_without_datasets_evaluate_or_the_serving_stack(tmp_path):
    """The serving wheels come from --prepare (which needs a package index: without one the serving row is left
    out and the test skips after checking the rest)."""
    hider = tmp_path / "hider"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text(HIDER.format(names=HIDDEN))
    env = {**os.environ, "PYTHONPATH": str(hider), "PIP_DEFAULT_TIMEOUT": "15", "PIP_RETRIES": "1"}
    env.pop("OUT", None)
    hidden = subprocess.run([sys.executable, "-c", "import datasets"], env=env, capture_output=True, text=True)
    assert hidden.returncode != 0, "the hider did not hide datasets"
    assets = tmp_path / "assets"
    try:
        prepared = subprocess.run([sys.executable, str(SCRIPT), "--prepare", str(assets)], env=env, cwd=REPO,
                                  capture_output=True, text=True, timeout=300).returncode == 0
    except subprocess.TimeoutExpired:
        prepared = False
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--preflight", "--out", str(out),
                           *(["--assets", str(assets)] if prepared else ["--no-serve"])],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    report = json.loads((out / "preflight.json").read_text())
    assert proc.returncode == 0 and report["passed"], proc.stdout + proc.stderr[-2000:]
    rows = report["rows"]
    expected = {"imports", "bitfit", "bitfit-fast", "ceiling", "real-text", "trainer-checks", "full-fast", "lora",
                "bitfit-lora"}
    assert expected <= set(rows) and all(rows[r]["ok"] for r in rows), rows
    assert rows["imports"]["detail"]["bitfit_hf"] == str(REPO / "bitfit_hf")  # the checkout, through PYTHONPATH
    if not prepared:
        pytest.skip("no package index for --prepare: the serving row was left out (the training rows passed)")
    assert rows["serve"]["ok"] and "installed into" in rows["serve"]["reason"], rows["serve"]
