"""``--train_file`` / ``--validation_file`` / ``--model_name_or_path`` of the method comparison (``method_defaults.py``)
and the learning-rate sweep (``lr_sweep.py``) reach ``recipes/glue.py``'s command line, and their results never land in (or resume from)
another data set's file. The recipe is replaced by a stub that writes what it would (no training here); the slow test
runs one tiny real row on CSV files."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def benchmarks(monkeypatch):
    """The two scripts as modules (method_defaults imports lr_sweep as a sibling, as when run as a script)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("lr_sweep"), importlib.import_module("method_defaults")


@pytest.fixture
def recipe_calls(monkeypatch):
    """Stand in for the recipe cell: record each command line and write the files a finished run leaves."""
    from bitfit_hf.utils import cell_runs

    calls = []

    def fake_run(recipe, flags, output_dir, *, name, **kwargs):
        command = cell_runs.recipe_command(recipe, flags, output_dir)
        calls.append(command)
        out = Path(output_dir)
        seed = int(command[command.index("--seed") + 1]) if "--seed" in command else 42
        (out / "all_results.json").write_text(json.dumps({"eval_accuracy": 0.75 + seed / 100, "init_eval_accuracy": 0.5,
                                                          "train_loss": 0.4}))
        (out / "run_args.json").write_text(json.dumps({"training_args": {"learning_rate": 0.003, "seed": seed}}))
        return cell_runs.CellRun(name=name, command=tuple(command), returncode=0, wall_s=1.0, peak_rss_mb=100.0,
                                 cpu_s=1.0, tail="")

    monkeypatch.setattr(cell_runs, "run_recipe_cell", fake_run)
    return calls


@pytest.fixture
def csv_files(tmp_path):
    train, dev = tmp_path / "my train.csv", tmp_path / "dev.csv"
    train.write_text("sentence,label\n" + "".join(f"text {i},{i % 2}\n" for i in range(40)))
    dev.write_text("sentence,label\na,1\nb,1\nc,0\nd,1\n")
    return train, dev


def flag(command, name):
    return command[command.index(name) + 1] if name in command else None


def test_method_comparison_trains_and_scores_on_the_users_files(benchmarks, recipe_calls, csv_files, tmp_path, capsys):
    _, method_defaults = benchmarks
    train, dev = csv_files
    results = tmp_path / "rows.jsonl"
    assert method_defaults.main(["--methods", "bitfit,lora", "--train_file", str(train), "--validation_file", str(dev),
                                 "--results", str(results), "--threads", "1"]) == 0
    assert len(recipe_calls) == 2
    for command in recipe_calls:
        assert command[1] == method_defaults.RECIPE
        assert flag(command, "--train_file") == str(train.resolve()) and flag(command, "--validation_file") == str(dev.resolve())
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert all(row["data"] == ["--train_file", str(train.resolve()), "--validation_file", str(dev.resolve())] for row in rows)
    assert "'" + str(train.resolve()) + "'" in rows[0]["command"]  # quoted: the path has a space
    table = (tmp_path / "rows.md").read_text()
    assert "Majority class of those examples: **75.0%**" in table and "scored on the validation file" in table
    # a second call resumes: nothing runs again
    assert method_defaults.main(["--methods", "bitfit,lora", "--train_file", str(train), "--validation_file", str(dev),
                                 "--results", str(results)]) == 0
    assert len(recipe_calls) == 2
    capsys.readouterr()


def test_method_comparison_refuses_half_the_data_and_other_datas_results(benchmarks, recipe_calls, csv_files, tmp_path,
                                                                          capsys):
    _, method_defaults = benchmarks
    train, dev = csv_files
    for argv, message in (
        (["--train_file", str(train)], "--train_file needs --validation_file"),
        (["--validation_file", str(dev)], "--validation_file scores runs trained on --train_file"),
        (["--train_file", str(tmp_path / "nope.csv"), "--validation_file", str(dev)], "nope.csv: no such file"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            method_defaults.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    # the committed measurements (offline default data) are never resumed by, or mixed with, a run on other data
    committed = ROOT / "benchmarks" / "results" / "method_defaults.jsonl"
    with pytest.raises(SystemExit):
        method_defaults.main(["--train_file", str(train), "--validation_file", str(dev), "--results", str(committed)])
    assert "holds runs on other data (the offline default data)" in capsys.readouterr().err
    assert recipe_calls == []


def test_method_comparison_on_several_seeds(benchmarks, recipe_calls, csv_files, tmp_path, capsys):
    _, method_defaults = benchmarks
    train, dev = csv_files
    results = tmp_path / "rows.jsonl"
    argv = ["--methods", "bitfit,lora", "--train_file", str(train), "--validation_file", str(dev),
            "--results", str(results), "--seeds", "0,1"]
    assert method_defaults.main(argv) == 0
    assert sorted((command[command.index("--method") + 1], flag(command, "--seed")) for command in recipe_calls) == [
        ("bitfit", "0"), ("bitfit", "1"), ("lora", "0"), ("lora", "1")]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert all("--seed" not in row["data"] for row in rows)  # the data flags alone: resumable with other seeds
    table = (tmp_path / "rows.md").read_text()
    assert "**75.5%** (seed 0: 75.0, seed 1: 76.0)" in table and "--method bitfit --train_file" in table
    assert "--seed S" in table
    assert method_defaults.main(argv) == 0 and len(recipe_calls) == 4  # resumed: nothing runs again
    assert method_defaults.main([*argv[:-1], "0,1,2"]) == 0 and len(recipe_calls) == 6  # only the new seed runs
    with pytest.raises(SystemExit):
        method_defaults.main([*argv[:-1], "zero"])
    assert "whole numbers" in capsys.readouterr().err


def test_own_data_results_default_to_outputs(benchmarks, recipe_calls, csv_files, tmp_path, monkeypatch, capsys):
    _, method_defaults = benchmarks
    train, dev = csv_files
    monkeypatch.chdir(tmp_path)
    assert method_defaults.main(["--methods", "frozen", "--train_file", str(train), "--validation_file", str(dev)]) == 0
    assert (tmp_path / "outputs" / "method_defaults-my train.jsonl").is_file()
    assert (tmp_path / "outputs" / "method_defaults-my train.md").is_file()
    capsys.readouterr()


def test_sweep_carves_its_dev_split_from_the_train_file_or_scores_on_the_validation_file(
        benchmarks, recipe_calls, csv_files, tmp_path, capsys):
    lr_sweep, _ = benchmarks
    train, dev = csv_files
    assert lr_sweep.main(["--methods", "bitfit", "--seeds", "0", "--dev-size", "8", "--train_file", str(train),
                          "--results", str(tmp_path / "carved.jsonl")]) == 0
    assert len(recipe_calls) == len(lr_sweep.GRID["bitfit"])
    for command in recipe_calls:
        assert flag(command, "--train_file") == str(train.resolve()) and "--validation_file" not in command
        assert flag(command, "--dev_split_from_train") == "8"
    recipe_calls.clear()
    assert lr_sweep.main(["--methods", "lora", "--seeds", "0", "--train_file", str(train), "--validation_file", str(dev),
                          "--results", str(tmp_path / "dev.jsonl")]) == 0
    assert recipe_calls and all("--dev_split_from_train" not in command for command in recipe_calls)
    assert all(flag(command, "--validation_file") == str(dev.resolve()) for command in recipe_calls)
    assert "scored on the validation file" in (tmp_path / "dev.md").read_text()
    capsys.readouterr()


def test_another_base_reaches_the_recipe_and_names_the_results(benchmarks, recipe_calls, csv_files, tmp_path,
                                                                monkeypatch, capsys):
    lr_sweep, method_defaults = benchmarks
    train, dev = csv_files
    monkeypatch.chdir(tmp_path)
    assert method_defaults.main(["--methods", "bitfit", "--model_name_or_path", "mpnet"]) == 0
    (command,) = recipe_calls
    assert flag(command, "--model_name_or_path") == "mpnet" and "--train_file" not in command
    assert (tmp_path / "outputs" / "method_defaults-mpnet.jsonl").is_file()
    recipe_calls.clear()
    (tmp_path / "base").mkdir()
    assert lr_sweep.main(["--methods", "bitfit", "--seeds", "0", "--model_name_or_path", "base", "--train_file",
                          str(train), "--validation_file", str(dev)]) == 0
    assert all(flag(c, "--model_name_or_path") == str(tmp_path / "base") for c in recipe_calls)  # a folder: absolute
    assert (tmp_path / "outputs" / "lr_sweep-my train.jsonl").is_file()
    capsys.readouterr()


def test_recipe_args_reach_every_cell_and_keep_their_results_apart(benchmarks, recipe_calls, tmp_path, monkeypatch,
                                                                     capsys):
    """``--recipe-args`` (a smaller budget for a base-size model) reach each cell's command, are recorded with its row,
    send the results to outputs/ (not the committed table), and a resumed sweep with other recipe flags is refused."""
    lr_sweep, _ = benchmarks
    monkeypatch.chdir(tmp_path)
    argv = ["--methods", "bitfit", "--seeds", "0", "--model_name_or_path", "mpnet",
            "--recipe-args", "--max_train_samples 1000 --tf32 True"]
    assert lr_sweep.main(argv) == 0
    assert recipe_calls and all(flag(c, "--max_train_samples") == "1000" and flag(c, "--tf32") == "True"
                                for c in recipe_calls)
    rows = [json.loads(line) for line in (tmp_path / "outputs" / "lr_sweep-mpnet.jsonl").read_text().splitlines()]
    assert len(rows) == len(recipe_calls) and all(row["data"][-4:] == ["--max_train_samples", "1000", "--tf32", "True"]
                                                  for row in rows)
    recipe_calls.clear()
    with pytest.raises(SystemExit):
        lr_sweep.main(argv[:-1] + ["--max_train_samples 500"])
    assert not recipe_calls
    capsys.readouterr()


def test_default_data_commands_are_unchanged(benchmarks, recipe_calls, tmp_path, capsys):
    """Without data flags the recipe gets exactly the committed tables' command lines."""
    lr_sweep, _ = benchmarks
    row = lr_sweep.run_cell("bitfit", 3e-3, 0, 1000, 1, [])
    assert row["command"] == ("python recipes/glue.py --method bitfit --learning_rate 0.003 --seed 0 "
                              "--dev_split_from_train 1000 --eval_before_training false --save_strategy no "
                              "--report_to none")
    assert "data" not in row


@pytest.mark.slow
def test_method_comparison_quick_on_csv_files(csv_files, tmp_path):
    """One tiny real row: the recipe reads the CSV files, and the row records them."""
    train, dev = csv_files
    results = tmp_path / "rows.jsonl"
    command = [sys.executable, str(ROOT / "benchmarks" / "method_defaults.py"), "--quick", "--methods", "bitfit",
               "--train_file", str(train), "--validation_file", str(dev), "--results", str(results)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["data"][1] == str(train.resolve()) and 0.0 <= row["accuracy"] <= 1.0


def test_the_table_gives_each_methods_lowest_run_against_the_majority_class(benchmarks):
    """The target a default is held to (every seed well above the constant predictor) is read off the table: the
    worse seed of each method, in points over the majority class, and the lowest run of all."""
    _, method_defaults = benchmarks
    rows = {f"{m}|{s}": {"method": m, "seed": s, "accuracy": acc, "learning_rate": 1e-3, "before": 0.5,
                         "train_loss": 0.3, "trained_values": 10, "adapter_bytes": 2048,
                         "command": f"python recipes/glue.py --method {m} --seed {s}"}
            for (m, s), acc in {("bitfit", 0): 0.896, ("bitfit", 1): 0.880, ("lora", 0): 0.470}.items()}
    table = method_defaults.markdown(rows, 0.528, "a machine", ["--max_train_samples", "1000"])
    header = next(line for line in table.splitlines() if line.startswith("| command"))
    assert header.endswith("| lowest run vs majority |")
    bitfit = next(line for line in table.splitlines() if "--method bitfit" in line)
    lora = next(line for line in table.splitlines() if "--method lora" in line)
    assert bitfit.endswith("| +35.2 |")  # seed 1's 88.0, not the mean, against 52.8
    assert lora.endswith("| -5.8 |")  # a collapse below the constant predictor shows as such
    assert "Lowest single run: `lora` on seed 0, 47.0% (-5.8 points over the majority class), across 3 runs." in table
    no_majority = method_defaults.markdown(rows, None, "a machine", ["--max_train_samples", "1000"])
    assert "vs majority" not in no_majority and "Lowest single run" not in no_majority
