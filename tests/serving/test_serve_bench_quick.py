"""benchmarks/serve_load.py runs end to end on the real MiniLM (correctness only: timings are never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_serve_load_quick(tmp_path, minilm_dir):
    out, md = tmp_path / "result.json", tmp_path / "result.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "serve_load.py"), "--quick", "--requests", "24",
                           "--warmup", "8", "--clients", "4", "--split-servers", "2", "--json", str(out), "--markdown", str(md)],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {row["key"]: row for row in result["configs"]}
    assert set(rows) == {"one", "mixed-8", "switch-8", "split-8"}
    for row in rows.values():
        (run,) = row["runs"]
        assert run["requests"] == 24 and run["failed"] == 0 and run["rps"] > 0 and run["rss_bytes"] > 0
    assert rows["mixed-8"]["mean_adapters_per_batch"] >= 1 and rows["switch-8"]["mean_adapters_per_batch"] == 1
    assert result["full_copies_rss_bytes"]["8"] > 7 * result["full_model_bytes"]
    # two servers: both answered (each holds its own base: about twice one server's memory)
    assert rows["split-8"]["rss_bytes"] > 1.5 * rows["mixed-8"]["rss_bytes"]
    assert "Machine:" in md.read_text() and "(c) one full model copy per task" in md.read_text()
    if sys.platform.startswith("linux"):  # the server's CPU by thread, from /proc
        for row in rows.values():
            assert {"bitfit-worker", "event loop"} <= set(row["runs"][0]["thread_cpu_ms"])
            assert sum(row["runs"][0]["thread_cpu_ms"].values()) == pytest.approx(row["runs"][0]["server_cpu_ms"], rel=0.25, abs=3.0)  # clock ticks
        assert "| configuration | worker (and its torch threads) | event loop (HTTP) |" in md.read_text()
