"""benchmarks/serve_pass_cpu.py runs end to end on the real MiniLM and checks what it times (timings are never
asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_serve_pass_cpu_quick(tmp_path, minilm_dir):
    out, md = tmp_path / "result.json", tmp_path / "result.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "serve_pass_cpu.py"), "--quick", "--busy",
                           "0,0.5", "--json", str(out), "--markdown", str(md)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {(r["model"], r["runtime"], r["layout"], r["busy"]): r for r in result["rows"]}
    has_ort = importlib.util.find_spec("onnx") is not None and importlib.util.find_spec("onnxruntime") is not None
    runtimes = {"eager", "torchscript", *(["onnxruntime"] if has_ort else [])}
    for busy in (0.0, 0.5):
        assert {k[1] for k in rows if k[0] == "stock base" and k[3] == busy} == runtimes
        assert {k[2] for k in rows if k[0] == "served" and k[3] == busy} == {"packed", "padded"}  # MiniLM packs
    for row in rows.values():
        assert row["threads"] == 1 and row["inputs"] == 4 and len(row["reps"]) == 1
        assert row["wall_ms"] > 0 and row["cpu_ms"] > 0 and 0 < row["tokens"] <= row["padded_tokens"]
    checks = result["checks"]
    assert checks["served packed vs padded, logits"] <= 1e-5
    assert checks["stock base torchscript vs eager, real tokens"] <= 1e-4
    if has_ort:
        assert checks["stock base onnxruntime vs eager, real tokens"] <= 1e-4
    else:
        assert "onnxruntime" in result["skipped"] and "pip install onnx onnxruntime" in md.read_text()
    assert "Machine:" in md.read_text() and "| served | torch eager, packed | 1 | 50% |" in md.read_text()
