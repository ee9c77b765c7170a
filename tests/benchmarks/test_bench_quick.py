"""The benchmarks' quick modes run end to end (correctness only: timings are never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script, tmp_path, *extra, timeout=1800):
    out = tmp_path / "result.json"
    md = tmp_path / "result.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--quick", "--json", str(out),
                           "--markdown", str(md), *extra], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Machine:" in md.read_text()
    return json.loads(out.read_text())


@pytest.mark.slow
def test_train_cost_quick(tmp_path):
    """With --jobs 2 the workers load side by side, the path a GPU run takes; every row's checks must hold there too."""
    result = _run("train_cost.py", tmp_path, "--jobs", "2")
    assert all(res["jobs"] == 2 for res in result["models"].values())
    assert set(result["models"]) == {"tiny", "minilm"}
    for model, res in result["models"].items():
        rows = res["rows"]
        paper = "bitfit:bias_terms=paper-subset"
        assert {"full", "bitfit", paper, "frozen", "lora", "bitfit_lora", "ia3", "bitfit_ia3"} <= set(rows)
        full = rows["full"]
        assert full["trainable_params"] == full["total_params"]
        for method, row in rows.items():
            assert row["checks"], (model, method, row["check_failures"])
            assert row["measured_steps"] == res["rounds"], (model, method)
            assert row["samples_per_s"] > 0 and row["peak_bytes"] > 0
            assert row["memory_measure"] == "peak RSS (VmHWM)" and row["mixed_precision"] == "no"
            assert 0 < row["trainable_params"] <= row["total_params"]
            assert row["adapter_bytes"] > 0
            if method != "full":  # Adam: two fp32 moments per trained value, plus a step counter per tensor
                assert row["trainable_params"] < full["trainable_params"]
                assert 8 * row["trainable_params"] <= row["optimizer_state_bytes"] <= 8 * row["trainable_params"] + 8192
                assert row["adapter_bytes"] < full["adapter_bytes"] / 5
        assert rows["frozen"]["trainable_params"] < rows[paper]["trainable_params"] < rows["bitfit"]["trainable_params"]
        # BitFit + LoRA trains exactly BitFit `all` plus the LoRA row's matrices (same head in both)
        lora_matrices = rows["lora"]["trainable_params"] - rows["frozen"]["trainable_params"]
        assert rows["bitfit_lora"]["trainable_params"] == rows["bitfit"]["trainable_params"] + lora_matrices
        # likewise BitFit + (IA)³ is BitFit `all` plus the (IA)³ row's vectors, and the vectors are few
        vectors = rows["ia3"]["trainable_params"] - rows["frozen"]["trainable_params"]
        assert 0 < vectors < rows["bitfit"]["trainable_params"]
        assert rows["bitfit_ia3"]["trainable_params"] == rows["bitfit"]["trainable_params"] + vectors
        assert rows["bitfit"]["optim"] == "adamw_torch_fused"  # the Trainer default...
        assert rows["bitfit"]["optimizer_impl"] == "foreach"  # ...which BitFitTrainer runs as foreach on CPU
        assert rows["full"]["optimizer_impl"] == "fused"


@pytest.mark.slow
def test_train_cost_bf16_trains_in_mixed_precision(tmp_path):
    """The GPU table's settings (Trainer bf16=True) also run on a CPU, so the path cannot rot unnoticed. The old row
    names still work: results are keyed by the rows they are now."""
    result = _run("train_cost.py", tmp_path, "--models", "tiny", "--methods",
                  "full,bitfit-all,plain-bitfit-all,bitfit-all@frozen-bf16,lora@frozen-bf16", "--precision", "bf16")
    res = result["models"]["tiny"]
    assert (res["device"], res["precision"]) == ("cpu", "bf16")
    rows = res["rows"]
    for method, row in rows.items():
        assert row["checks"], (method, row["check_failures"])  # frozen tensors bit-identical, trained ones moved
        assert row["precision"] == "bf16"
    assert set(rows) == {"full", "bitfit", "plain-bitfit", "bitfit@frozen-bf16", "lora@frozen-bf16"}
    assert rows["full"]["mixed_precision"] == rows["bitfit"]["mixed_precision"] == "bf16"
    assert "CPU, bf16" in (tmp_path / "result.md").read_text()
    # frozen_dtype rows: frozen Linear weights in bf16 (unchanged by training), the same trained tensors as without
    for method in ("bitfit@frozen-bf16", "lora@frozen-bf16"):
        memory = res["raw_memory"][method][0]
        assert memory["frozen_bf16_tensors"] > 0 and memory["trained_not_float32"] == []
    assert rows["bitfit@frozen-bf16"]["trainable_params"] == rows["bitfit"]["trainable_params"]
    assert "frozen weights bf16" in (tmp_path / "result.md").read_text()


def test_train_cost_frozen_bf16_needs_bf16():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "train_cost.py"), "--methods",
                           "bitfit-all@frozen-bf16"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and "--precision bf16" in proc.stderr and "Traceback" not in proc.stderr


def test_train_cost_refuses_cuda_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this check is about machines without a GPU")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "train_cost.py"), "--device", "cuda"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert "sees no CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_task_switching_quick(tmp_path):
    result = _run("task_switching.py", tmp_path)
    res = result["models"]["tiny"]
    sizes = res["sizes"]
    for terms in ("all", "paper-subset"):
        assert sizes[terms]["fp16_bytes"] < sizes[terms]["fp32_bytes"] < sizes["full_fp32_bytes"] / 10
    sw = res["switching"]
    assert sw["activate_max_abs_diff"] == 0.0
    assert sw["adapters"] == 8 and sw["activate_median_s"] > 0
    mixed = res["mixed"]
    assert mixed["argmax_identical"] is True
    assert mixed["max_abs_diff_vs_separate"] < 1e-4
    assert len(mixed["rows"]) == 4


@pytest.mark.slow
def test_lora_profile_tiny(tmp_path):
    """BitFit + LoRA against LoRA and BitFit, operator by operator: the products LoRA adds are the rank-r ones, and
    BitFit + LoRA computes no weight gradient of a frozen matrix (no [hidden, tokens] x [tokens, hidden] product)."""
    out, md = tmp_path / "profile.json", tmp_path / "profile.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "lora_profile.py"), "--model", "tiny",
                           "--batch-size", "2", "--seq", "16", "--reps", "1", "--profile-steps", "1", "--precision",
                           "bf16", "--frozen-bf16", "--json", str(out), "--markdown", str(md)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"bitfit", "lora", "bitfit_lora"}
    tokens = 2 * 16
    for method, row in rows.items():
        assert row["step_cpu_s"] > 0 and sum(row["dispatched"].values()) > 0
        weight_grads = [k for k in row["product_shapes"] if f"[[64, {tokens}], [{tokens}, 64]]" in k]
        assert not weight_grads, (method, weight_grads)
    assert rows["bitfit_lora"]["trainable_tensors"] > rows["bitfit"]["trainable_tensors"] > rows["lora"]["trainable_tensors"]
    assert "Matrix products whose count differs" in md.read_text()


@pytest.mark.slow
def test_step_breakdown_tiny(tmp_path):
    out, md = tmp_path / "breakdown.json", tmp_path / "breakdown.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "step_breakdown.py"), "--model", "tiny",
                           "--batch-size", "2", "--seq", "16", "--reps", "1", "--json", str(out), "--markdown", str(md)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"full:on", "bitfit:on", "full:off", "bitfit:off"}
    assert all(row["forward_s"] > 0 and row["backward_s"] > 0 for row in rows.values())
    ops = {op["op"] for op in rows["bitfit:on"]["top_ops"]}
    assert "aten::addmm" in ops  # the profile of a real step, not an empty one
    mask = json.loads(out.read_text())["dropout_mask"]
    assert mask["shape"] == [2, 2, 16, 16] and all(s > 0 for s in mask["seconds_by_threads"].values())
    assert "Command: `python benchmarks/step_breakdown.py" in md.read_text()


@pytest.mark.slow
def test_lr_sweep_quick_scores_on_a_dev_split_carved_from_training(tmp_path):
    """Two tiny cells: results appended as JSON lines, the table rewritten, a second call resumes (runs nothing)."""
    results, table = tmp_path / "sweep.jsonl", tmp_path / "sweep.md"
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "lr_sweep.py"), "--quick", "--methods", "bitfit,lora",
               "--seeds", "0", "--results", str(results), "--markdown", str(table)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(row["method"] for row in rows) == ["bitfit", "lora"]
    for row in rows:
        assert 0.0 <= row["dev_accuracy"] <= 1.0
        assert "--dev_split_from_train 16" in row["command"] and "--validation_file" not in row["command"]
    assert "| `bitfit` |" in table.read_text() and "| `lora` |" in table.read_text()
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert again.returncode == 0 and len(results.read_text().splitlines()) == 2, "a finished cell runs again"


@pytest.mark.slow
def test_method_defaults_quick_runs_the_recipe_with_only_the_method_flag(tmp_path):
    """One tiny row: read back from the recipe's own outputs, appended as a JSON line, resumable."""
    results, table = tmp_path / "rows.jsonl", tmp_path / "rows.md"
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "method_defaults.py"), "--quick", "--methods", "bitfit",
               "--results", str(results), "--markdown", str(table)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["command"] == "python recipes/glue.py --method bitfit"
    assert row["trained_values"] > 0 and row["adapter_bytes"] > 0 and 0.0 <= row["accuracy"] <= 1.0
    assert "| `python recipes/glue.py --method bitfit` |" in table.read_text()
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert again.returncode == 0 and len(results.read_text().splitlines()) == 1, "a finished row runs again"
