"""The study end to end on a tiny budget: real recipe runs of a tiny BERT (MiniLM's tokenizer) on tiny
slices of the real data, killed mid-cell, resumed, and reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, minilm_dir):
    """A 2-layer BERT with all-MiniLM-L6-v2's tokenizer, saved like a checkpoint (random weights)."""
    import torch
    import transformers as T

    folder = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_dir)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=tokenizer.vocab_size, max_position_embeddings=512)
    torch.manual_seed(0)
    T.AutoModel.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _command(tiny_model, out):
    return [sys.executable, "-m", "bitfit_hf.study", "--budget", "smoke", "--tasks", "sentiment", "--methods", "bitfit",
            "--model_name_or_path", tiny_model, "--output_dir", str(out), "--no-progress", "--device", "cpu"]


def _env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="2",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _wait_for(condition, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _children_of(pid):
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except FileNotFoundError:  # pragma: no cover - no procps
        return []
    return [int(p) for p in out.split()]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def test_study_is_killed_mid_cell_resumes_and_reports(tiny_model, tmp_path):
    out = tmp_path / "study"
    cells = out / "cells"
    study = subprocess.Popen(_command(tiny_model, out), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: cells.is_dir() and len(list(cells.glob("*.json"))) == 1, 600, "the first finished cell")
        first = next(cells.glob("*.json"))
        first_bytes = first.read_bytes()
        # the second cell has started: its recipe process is running
        _wait_for(lambda: bool(_children_of(study.pid)), 120, "the second cell's recipe process")
        recipe_pids = _children_of(study.pid)
        time.sleep(3)
        study.send_signal(signal.SIGKILL)  # no chance to clean up
        study.wait(timeout=30)
    finally:
        if study.poll() is None:
            study.kill()
    # the recipe process dies with the study (PR_SET_PDEATHSIG), so it cannot write a record late
    _wait_for(lambda: not any(_alive(p) for p in recipe_pids), 30, "the orphaned recipe process to exit")
    assert [p.name for p in cells.glob("*.json")] == [first.name]

    resumed = subprocess.run(_command(tiny_model, out), cwd=REPO, env=_env(), capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "3 cells: 1 finished (skipped)" in resumed.stdout and "2 to run" in resumed.stdout
    assert first.read_bytes() == first_bytes  # the finished cell was not run again
    records = [json.loads(p.read_text()) for p in sorted(cells.glob("*.json"))]
    assert len(records) == 3 and all(r["status"] == "done" for r in records)

    # each record holds the run's own measurements
    for record in records:
        run = out / "runs" / record["cell_id"]
        results = json.loads((run / "all_results.json").read_text())
        assert record["score"] == pytest.approx(100 * results["eval_accuracy"])
        assert record["train_score"] == pytest.approx(100 * results["predict_accuracy"])
        assert results["predict_samples"] == 8  # the training-set score: first 8 training sentences
        assert record["trainable"]["trainable_params"] > 0 and record["peak_rss_mb"] > 0
        assert record["bias_change"]["roles"]  # BitFit runs record Figure 1's matrix
        assert not list(run.glob("*.safetensors"))  # weights pruned, JSON kept
    assert {(r["train_size"], r["seed"]) for r in records} == {(16, 1), (16, 2), (8, 1)}
    assert sum(r["eval_curve"] != [] for r in records) == 2  # per-epoch evaluation on the first seed only

    results = json.loads((out / "results.json").read_text())
    assert [c["id"] for c in results["claims"]] == list(range(1, 9))
    assert results["grid"]["sentiment"]["bitfit"]["score"]["n"] == 2
    verdicts = {c["id"]: c["verdict"] for c in results["claims"]}
    assert verdicts[1] == "reproduced"  # from configs alone
    assert verdicts[2] == verdicts[3] == "not testable here"  # no full fine-tuning in this study
    report = (out / "report.md").read_text()
    assert "| BitFit (all biases) |" in report and "## The claims" in report
    for name in ("grid.png", "bias_change.png", "curve.png"):
        assert (out / "figures" / name).read_bytes()[:4] == b"\x89PNG"

    # a third invocation has nothing to run
    again = subprocess.run(_command(tiny_model, out), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "3 finished (skipped)" in again.stdout and "0 to run" in again.stdout
