"""Time to accuracy: the targets and the time to them read from an evaluation log (fast), and the quick mode end to
end (slow: two recipe runs, the JSONL, the table, resuming). Timings are never asserted, only their consistency."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name):
    """A benchmark script as a module, with benchmarks/ on the path as when the script runs (its shared modules)."""
    if os.path.join(ROOT, "benchmarks") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tta = load("time_to_accuracy")
runner = load("adapterhub_runner")  # importable without `adapters`: only its pure helpers are tested here


def history():
    """A log_history as transformers writes it with --include_num_input_tokens_seen and logging = eval steps."""
    return [
        {"step": 25, "epoch": 0.25, "loss": 0.7, "train_runtime": 10.0},
        {"step": 25, "epoch": 0.25, "eval_accuracy": 0.60, "eval_runtime": 3.0},
        {"step": 50, "epoch": 0.5, "loss": 0.5, "train_runtime": 23.0},  # 10 s more training after a 3 s evaluation
        {"step": 50, "epoch": 0.5, "eval_accuracy": 0.80, "eval_runtime": 2.0},
        {"step": 75, "epoch": 0.75, "loss": 0.4, "train_runtime": 35.0},
        {"step": 75, "epoch": 0.75, "eval_accuracy": 0.78, "eval_runtime": 2.5},
        {"step": 75, "epoch": 0.75, "train_loss": 0.5, "train_runtime": 37.5},
        {"step": 75, "epoch": 0.75, "eval_accuracy": 0.78, "eval_runtime": 2.5},  # an evaluation after training
    ]


def test_eval_interval_is_a_fraction_of_an_epoch():
    assert tta.eval_interval(3200, 32, 4) == 25
    assert tta.eval_interval(48, 16, 4) == 1
    assert tta.eval_interval(3200, 32, 1) == 100


def test_eval_log_subtracts_earlier_evaluations_and_stops_at_the_end_of_training():
    log = tta.eval_log(history())
    assert [e["step"] for e in log] == [25, 50, 75]
    assert [e["train_s"] for e in log] == [10.0, 20.0, 30.0]
    assert [e["wall_s"] for e in log] == [10.0, 23.0, 35.0]
    assert tta.training_seconds(history()) == 30.0  # 37.5 less the three evaluations during training


def test_an_evaluation_without_a_timed_entry_has_no_time():
    log = tta.eval_log([{"step": 10, "epoch": 1.0, "eval_accuracy": 0.5, "eval_runtime": 1.0}])
    assert log[0]["train_s"] is None and log[0]["accuracy"] == 0.5


def test_targets_and_time_to_target():
    targets = tta.compute_targets([0.80, 0.84], {"upper": 0.95, "lower": 0.90})
    assert targets["upper"] == pytest.approx(0.779) and targets["lower"] == pytest.approx(0.738)
    log = tta.eval_log(history())
    hit = tta.time_to_target(log, targets["upper"])
    assert hit == {"step": 50, "epoch": 0.5, "train_s": 20.0, "accuracy": 0.80}
    assert tta.time_to_target(log, 0.81) is None
    with pytest.raises(ValueError):
        tta.compute_targets([], {"upper": 0.95})


def row(method, seed, accuracies, final=None, seconds_per_step=1.0):
    evals = [{"step": 10 * (i + 1), "epoch": (i + 1) / 4, "accuracy": a, "train_s": 10.0 * (i + 1)}
             for i, a in enumerate(accuracies)]
    return {"method": method, "seed": seed, "evals": evals, "final_accuracy": accuracies[-1] if final is None else final,
            "peak_mb": 100.0 + seed, "seconds_per_step": seconds_per_step, "trainable_fraction": 0.01,
            "learning_rate": 1e-3, "engine": "recipe", "peak_kind": "process peak RSS", "machine": "test machine",
            "load_start": [1.0, 1.0, 1.0], "date": "2026-11-27 00:00 UTC", "table_command": "python x"}


def test_summary_counts_the_seeds_that_reached_a_target():
    rows = [row("full", 0, [0.6, 0.8]), row("full", 1, [0.7, 0.8]),
            row("bitfit", 0, [0.5, 0.77, 0.79]), row("bitfit", 1, [0.5, 0.6, 0.7])]
    targets = tta.compute_targets([0.8, 0.8], {"upper": 0.95, "lower": 0.90})
    summary = tta.summarize(rows, targets)
    assert summary["full"]["targets"]["upper"] == {"reached": 2, "runs": 2, "train_s": 20.0, "step": 20, "epoch": 0.5}
    assert summary["bitfit"]["targets"]["upper"]["reached"] == 1
    assert summary["bitfit"]["targets"]["upper"]["train_s"] == 20.0  # the mean over the seed that reached it
    assert summary["bitfit"]["final_mean"] == pytest.approx(0.745)
    assert summary["bitfit"]["final_spread"] == pytest.approx(0.045)
    assert summary["bitfit"]["peak_mb"] == 101.0
    table = tta.markdown({f"{r['method']}|{r['seed']}": r for r in rows}, {"upper": 0.95, "lower": 0.90},
                         {"name": "t", "eval_steps": 10, "majority": 0.5})
    line = next(x for x in table.splitlines() if x.startswith("| `bitfit`"))
    assert "(1/2 seeds)" in line
    unreachable = tta.markdown({f"{r['method']}|{r['seed']}": r for r in rows}, {"upper": 2.0, "lower": 1.5},
                               {"name": "t", "eval_steps": 10})
    assert unreachable.count("not reached (2 seed(s))") == 4
    assert "No full fine-tuning run yet" in tta.markdown({"bitfit|0": rows[2]}, {"upper": 0.95, "lower": 0.9}, {})


def test_probe_rows_and_the_hard_target():
    assert tta.recipe_method_flags("bitfit") == ["--method", "bitfit", "--probe_head_start", "false"]
    assert tta.recipe_method_flags("lora+probe") == ["--method", "lora", "--probe_head_start", "true"]
    assert tta.recipe_method_flags("probe") == ["--method", "frozen", "--probe_head_start"]
    assert tta.recipe_method_flags("nope+probe") is None and tta.recipe_method_flags("adapter") is None
    targets = tta.compute_targets([0.84, 0.82], {"upper": 0.95, "lower": 0.9}, hard_gap=0.01)
    assert targets["hard"] == pytest.approx(0.82) and targets["upper"] == pytest.approx(0.95 * 0.83)


def _run_folder(folder, history, results):
    folder.mkdir()
    for name, value in (("trainer_state.json", {"log_history": history}), ("all_results.json", results),
                        ("trainable_summary.json", {"trainable_fraction": 0.01, "learning_rate": 3e-3}),
                        ("tta_memory.json", {"peak_rss_mb": 100.0})):
        (folder / name).write_text(json.dumps(value))
    return str(folder)


def test_the_probe_time_counts_in_every_time_to_a_target(tmp_path):
    probe = {"probe_feature_seconds": 30.0, "probe_fit_seconds": 1.5}
    out = _run_folder(tmp_path / "a", history(), {"eval_accuracy": 0.78, **probe})
    row = tta.row_from_output(out, "bitfit+probe", 0, ["cmd"], 80.0, "recipe")
    assert [e["train_s"] for e in row["evals"]] == [41.5, 51.5, 61.5]  # 10, 20, 30 s of training + the probe
    assert row["train_s"] == 61.5 and row["probe_s"] == 31.5
    assert row["seconds_per_step"] == pytest.approx(30.0 / 75)  # per optimizer step: the probe is not a step
    alone = _run_folder(tmp_path / "b", [{"probe_loss": 0.4, "step": 0}, {"step": 0, "eval_accuracy": 0.77}],
                        {"eval_accuracy": 0.77, **probe})
    row = tta.row_from_output(alone, "probe", 0, ["cmd"], 40.0, "recipe")
    assert row["evals"] == [{"step": 0, "epoch": 0.0, "accuracy": 0.77, "wall_s": 31.5, "train_s": 31.5, "eval_s": None}]
    assert row["timing"] == "measured" and tta.time_to_target(row["evals"], 0.75)["train_s"] == 31.5


def test_adapter_rows_at_other_rates():
    assert tta.adapter_rate("adapter") == tta.ADAPTER_LEARNING_RATE
    assert tta.adapter_rate("adapter@1e-3") == 1e-3
    for method in ("bitfit", "adapter@", "adapter@fast", "adapter@0", "adapter@-1e-3"):
        assert tta.adapter_rate(method) is None, method
    with pytest.raises(SystemExit):  # an unknown or malformed method stops before any run
        tta.main(["--methods", "adapter@fast", "--results", os.devnull])


def test_runner_helpers(tmp_path):
    assert runner.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    with pytest.raises(ValueError):
        runner.accuracy([1], [])
    good = {"model": "/m", "max_seq_length": 128, "train": [{"sentence": "a", "label": 1}],
            "dev": [{"sentence": "b", "label": 0}]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(good))
    assert runner.load_examples(str(path))["train"][0]["label"] == 1
    path.write_text(json.dumps({**good, "dev": [{"sentence": "b", "label": "0"}]}))
    with pytest.raises(ValueError, match="dev row 0"):
        runner.load_examples(str(path))
    summary = runner.trainable_summary(10, 1000, 1e-4)
    assert summary["trainable_fraction"] == 0.01 and set(summary) >= {"trainable_params", "total_params"}


@pytest.mark.slow
def test_quick_mode_writes_a_consistent_table_and_resumes(tmp_path):
    results = tmp_path / "tta.jsonl"
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "time_to_accuracy.py"), "--quick", "--methods",
               "full,bitfit", "--results", str(results), "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["method"] for r in rows] == ["full", "bitfit"]
    for r in rows:
        assert r["timing"] == "measured" and r["steps"] == 6 and len(r["evals"]) == 6
        times = [e["train_s"] for e in r["evals"]]
        assert times == sorted(times) and 0 < times[-1] <= r["train_s"] + 1e-6
        assert all(e["train_s"] <= e["wall_s"] for e in r["evals"])
        assert r["peak_mb"] > 0 and 0 < r["trainable_fraction"] <= 1
        assert r["final_accuracy"] == r["evals"][-1]["accuracy"]
    targets = tta.compute_targets([rows[0]["final_accuracy"]], {"upper": 0.95, "lower": 0.90})
    for r in rows:
        hit = tta.time_to_target(r["evals"], targets["lower"])
        if hit is not None:
            assert hit["train_s"] <= r["train_s"]
    table = (tmp_path / "tta.md").read_text()
    assert "| `full` |" in table and "| `bitfit` |" in table and "Machine:" in table

    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "seed=0 final" not in again.stdout  # both runs were already done: nothing ran
    assert len(results.read_text().splitlines()) == 2

    report = subprocess.run([*command, "--report", "--targets", "2.0,1.5", "--hard-gap", "-1"], capture_output=True, text=True, cwd=ROOT,
                            env=env, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "tta.md").read_text().count("not reached (1 seed(s))") == 4
