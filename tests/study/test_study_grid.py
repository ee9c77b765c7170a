"""The grid: cells, their identity, budgets, unavailable methods, the dry run and the figures (no training)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from bitfit_hf.study import runner
from bitfit_hf.study.budgets import BUDGETS, METHOD_ROWS, TASKS, CpuSizing, cpu_budget
from bitfit_hf.study.grid import StudySettings, epochs_for, plan, sweep_plan
from bitfit_hf.study.runner import NOT_AVAILABLE, Study, StudyError, available_methods


def test_every_row_names_a_method_and_the_main_methods_exist_in_this_build():
    assert {"bitfit", "full", "frozen"} <= available_methods()
    assert {row.method for row in METHOD_ROWS.values()} >= {"bitfit", "full", "frozen", "rand_uniform", "rand_row_col",
                                                           "adapterbias", "bitfit_lora", "lora", "ia3",
                                                           "bitfit_ia3"}
    for budget in BUDGETS.values():
        for task, share in budget.tasks.items():
            assert task in TASKS and set(share.methods + share.single_seed_methods) <= set(METHOD_ROWS)


def test_the_cpu_default_runs_only_the_tasks_it_learns_and_leaves_the_curve_to_the_gpu_budget():
    budget = BUDGETS["default"]
    assert set(budget.tasks) == {"sentiment", "pos"} and budget.curve is None
    assert "SQuAD curve is the GPU budget's" in budget.description
    assert BUDGETS["full"].curve.task == "qa" and {"pair", "qa"} <= set(BUDGETS["full"].tasks)
    gpu = BUDGETS["gpu"]  # the GPU budget has what the CPU default leaves out: pair, QA and the SQuAD curve
    assert set(gpu.tasks) == {"sentiment", "pair", "pos", "qa"} and gpu.curve.task == "qa"
    assert all(len(share.seeds) >= 3 for share in gpu.tasks.values()) and gpu.sweep is not None
    assert gpu.tasks["qa"].train_size in [n for n, _ in gpu.curve.sizes]  # the grid's QA cells are a curve point
    with pytest.raises(ValueError, match="add 'qa' to CpuSizing.tasks"):
        cpu_budget(CpuSizing(curve_sizes=((100, (1,)),)))
    with pytest.raises(ValueError, match="the CPU budget's tasks are"):
        cpu_budget(CpuSizing(tasks=("sentiment", "ner")))


def test_curve_and_grid_share_cells_at_the_same_size():
    budget = cpu_budget(CpuSizing(tasks=("sentiment", "pair", "pos", "qa"),
                                  curve_sizes=((100, (1, 2)), (200, (1, 2)), (800, (1, 2)))))
    assert budget.curve.task == "qa"  # the paper's Figure 2 is a SQuAD curve
    rates = {("qa", "bitfit"): 1e-2, ("qa", "full"): 5e-5}
    cells = plan(budget, rates=rates)
    ids = [c.cell_id(StudySettings()) for c in cells]
    assert len(ids) == len(set(ids))  # each run once
    size = budget.tasks["qa"].train_size
    assert size in [n for n, _ in budget.curve.sizes]
    shared = [c for c in cells if c.task == "qa" and c.method == "bitfit" and c.train_size == size]
    assert len(shared) == len(budget.tasks["qa"].seeds)
    assert all(set(c.purposes) == {"grid", "curve"} and c.learning_rate == 1e-2 for c in shared)
    curve = [c for c in cells if c.task == "qa" and "curve" in c.purposes]
    assert {c.train_size for c in curve} == {n for n, _ in budget.curve.sizes}
    assert all(c.learning_rate == rates[("qa", c.method)] for c in curve)  # the task's chosen rate at every size
    # cost rows run with the first seed only; claim rows with every seed
    assert {c.seed for c in cells if c.method == "lora"} == {budget.tasks["sentiment"].seeds[0]}
    # per-epoch evaluation (epochs to converge) on the first seed only in the default budget
    assert all(c.epoch_eval == (c.seed == 1) for c in cells)


def test_sweep_cells_carve_a_dev_split_and_main_cells_wait_for_their_rate():
    from bitfit_hf.recipe_kit.args import DEFAULT_LEARNING_RATES

    budget = BUDGETS["default"]
    sweep = sweep_plan(budget, tasks=["pos"])
    assert {c.method for c in sweep} == {"bitfit", "full"}
    full_rates = sorted(c.learning_rate for c in sweep if c.method == "full")
    assert full_rates == [float(f"{DEFAULT_LEARNING_RATES['full'] * f:.3g}") for f in budget.sweep.factors]
    args = sweep[0].recipe_args(StudySettings())
    dev = budget.tasks["pos"].dev_samples
    assert args[args.index("--dev_split_from_train") + 1] == str(dev)
    assert "--do_predict" not in args and "--predict_split" not in args  # the sweep scores the dev split only
    assert args[args.index("--max_train_samples") + 1] == str(budget.tasks["pos"].train_size)
    assert sweep[0].cell_id(StudySettings()).startswith("sweep-pos-bitfit-n400-lr")
    # without chosen rates the main cells of swept rows await them; with them they carry --learning_rate
    waiting = plan(budget, tasks=["pos"])
    assert waiting and all(c.awaits_rate and c.learning_rate is None for c in waiting)
    chosen = plan(budget, tasks=["pos"], rates={("pos", "bitfit"): 3e-3, ("pos", "full"): 2e-5})
    assert not any(c.awaits_rate for c in chosen)
    args = next(c for c in chosen if c.method == "bitfit").recipe_args(StudySettings())
    assert args[args.index("--learning_rate") + 1] == "0.003"
    # rows the sweep does not tune (the single-seed cost rows) keep the recipe's default rate
    lora = plan(budget, tasks=["sentiment"], methods=["lora"])
    assert lora and not lora[0].awaits_rate and "--learning_rate" not in lora[0].recipe_args(StudySettings())
    assert sweep_plan(BUDGETS["smoke"]) == []


def test_constant_schedule_and_cpu_budget_sizing_are_parameters():
    cell = plan(BUDGETS["smoke"], tasks=["pos"], methods=["bitfit"])[0]
    args = cell.recipe_args(StudySettings(lr_scheduler_type="constant"))
    assert args[args.index("--lr_scheduler_type") + 1] == "constant"
    assert "--lr_scheduler_type" not in cell.recipe_args(StudySettings())  # the recipes' default (linear)
    assert cell.key(StudySettings(lr_scheduler_type="constant")) != cell.key(StudySettings())
    sizing = CpuSizing(tasks=("sentiment", "pos", "qa"),
                       train_size=(("sentiment", 800), ("pair", 400), ("pos", 300), ("qa", 200)), min_steps=60,
                       curve_sizes=((200, (1, 2)), (3200, (1, 2))), sweep_factors=(0.5, 1.0), sweep=True)
    budget = cpu_budget(sizing, name="trial")
    assert budget.name == "trial" and budget.tasks["sentiment"].train_size == 800 and budget.min_steps == 60
    assert budget.tasks["sentiment"].methods == BUDGETS["default"].tasks["sentiment"].methods  # same shape
    assert budget.curve.sizes == ((200, (1, 2)), (3200, (1, 2))) and budget.sweep.factors == (0.5, 1.0)
    assert cpu_budget(CpuSizing(sweep=False)).sweep is None
    assert cpu_budget() == BUDGETS["default"]


def test_plan_filters_and_rejects_unknown_names():
    cells = plan(BUDGETS["smoke"], tasks=["pos"], methods=["full"])
    assert {(c.task, c.method) for c in cells} == {("pos", "full")}
    with pytest.raises(ValueError, match="unknown task or method row: nope"):
        plan(BUDGETS["smoke"], tasks=["nope"])


def test_small_training_sets_get_enough_steps():
    assert epochs_for(100, 32, 3, 40) == 10  # 4 steps per epoch
    assert epochs_for(3200, 32, 3, 40) == 3
    assert epochs_for(8, 32, 1, 1) == 1


def test_cell_identity_is_its_exact_command():
    cell = plan(BUDGETS["smoke"], tasks=["pos"], methods=["bitfit"])[0]
    base = StudySettings()
    assert cell.cell_id(base) == cell.cell_id(StudySettings())
    assert cell.cell_id(base).startswith("pos-bitfit-n16-s1-")
    assert cell.cell_id(StudySettings(model_name_or_path="other")) != cell.cell_id(base)
    assert cell.cell_id(StudySettings(recipe_args=("--bf16", "True"))) != cell.cell_id(base)
    args = cell.recipe_args(StudySettings(device="cpu"))
    assert args[args.index("--predict_split") + 1] == "train" and "--use_cpu" in args
    assert args[args.index("--method") + 1] == "bitfit"


def test_rows_for_methods_missing_from_the_build_are_planned_but_never_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "available_methods", lambda: frozenset({"bitfit", "frozen"}))
    study = Study(str(tmp_path / "study"), BUDGETS["smoke"], StudySettings(), tasks=["pos"], methods=["full"])
    states = study.states()
    assert states and all(s.status == "unavailable" for s in states)

    def must_not_run(*args, **kwargs):
        raise AssertionError("an unavailable cell was started")

    monkeypatch.setattr(Study, "_run_cell", must_not_run)
    messages = []
    study.run(progress=False, echo=messages.append)
    assert NOT_AVAILABLE in messages[0] and "0 to run" in messages[0]

    from bitfit_hf.study.report import write_report

    results = write_report(study.output_dir, study.states(), study.budget, study.settings, param_counts={})
    assert results["grid"]["pos"]["full"]["status"] == NOT_AVAILABLE
    report = (tmp_path / "study" / "report.md").read_text()
    assert f"| full fine-tuning | {NOT_AVAILABLE} |" in report
    assert f"cell(s) {NOT_AVAILABLE}: `--method full`" in report
    claim_8 = next(c for c in results["claims"] if c["id"] == 8)
    assert claim_8["verdict"] == "not testable here" and NOT_AVAILABLE in claim_8["evidence"]


def test_dry_run_of_the_full_budget_through_the_cli(tmp_path, capsys):
    from bitfit_hf.cli.main import main as cli_main

    assert cli_main(["study", "--budget", "full", "--dry-run", "--output_dir", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    cells = plan(BUDGETS["full"]) + sweep_plan(BUDGETS["full"])
    assert f"{len(cells)} cells" in out
    assert "qa-full-n8000-s3-lr?" in out  # the paper's SQuAD curve, at the rate the sweep will choose
    assert "sweep-qa-full-n4000-lr" in out and "waiting" in out
    assert "estimated time" in out and "--dev_split_from_train" in out
    assert not (tmp_path / "s").exists()  # a dry run writes nothing


def test_figures_render_from_hand_made_tables(tmp_path):
    from bitfit_hf.study.aggregate import find_crossover, stat
    from bitfit_hf.study.figures import plot_curve, plot_grid

    def point(size, values):
        return {"size": size, "score": stat(values), "status": "done"}

    curve = {"task": "sentiment", "methods": {"bitfit": [point(100, [70, 72]), point(1600, [80, 81])],
                                              "full": [point(100, [65, 66]), point(1600, [83, 84])]}}
    curve["crossover_size"] = find_crossover([{"size": 100, "difference": 5.5}, {"size": 1600, "difference": -3.0}])
    assert 100 < curve["crossover_size"] < 1600
    grid = {"sentiment": {"bitfit": {"score": stat([70, 72])}, "full": {"score": stat([65, 66])}}}
    for path in (plot_curve(curve, {}, "accuracy", str(tmp_path / "curve.png")),
                 plot_grid(grid, {}, str(tmp_path / "grid.png"))):
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


FAKE_RECIPE = '''
import json, os, sys
args = sys.argv[1:]
out = args[args.index("--output_dir") + 1]
method = args[args.index("--method") + 1]
if method == "full":
    print("glue.py: error: --method full: something the user must fix", file=sys.stderr)
    sys.exit(2)
os.makedirs(out, exist_ok=True)
seed = int(args[args.index("--seed") + 1])
results = {"eval_accuracy": 0.5 + seed / 100, "predict_accuracy": 0.9, "train_runtime": 10.0}
json.dump(results, open(os.path.join(out, "all_results.json"), "w"))
history = [{"epoch": 1.0, "eval_accuracy": 0.45, "eval_runtime": 2.0}, {"epoch": 2.0, "eval_accuracy": 0.5 + seed / 100,
           "eval_runtime": 3.0}]
json.dump({"log_history": history}, open(os.path.join(out, "trainer_state.json"), "w"))
open(os.path.join(out, "adapter_model.safetensors"), "wb").write(b"weights")
open(os.path.join(out, "tokenizer.json"), "w").write("{}")
'''


def test_runner_records_results_and_failures_of_each_cell(tmp_path):
    """The runner's bookkeeping with a stand-in recipe (no training): records, failures, pruning, skipping."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "glue.py").write_text(FAKE_RECIPE)
    study = Study(str(tmp_path / "study"), BUDGETS["smoke"], StudySettings(), tasks=["sentiment"],
                  methods=["bitfit", "full"], seeds=[1, 2], recipes_dir=str(recipes))
    lines = []
    states = study.run(progress=False, echo=lines.append)
    done = {s.cell_id: s.record for s in states if s.status == "done"}
    failed = [s for s in states if s.status == "failed"]
    assert len(done) == 3 and len(failed) == 3  # bitfit n16 s1, s2, n8 s1; full the same
    for state in failed:
        assert "exit status 2: glue.py: error: --method full" in state.record["error"]
    record = done[next(s.cell_id for s in states if s.cell.seed == 2 and s.cell.method == "bitfit")]
    assert record["score"] == pytest.approx(52.0) and record["train_score"] == pytest.approx(90.0)
    assert record["train_time_s"] == pytest.approx(5.0)  # 10 s minus the 5 s of evaluations inside training
    assert record["epochs_to_converge"] == 2.0 and record["peak_rss_mb"] > 0
    import torch

    assert record["environment"]["torch"] == torch.__version__ and record["environment"]["platform"]  # where it ran
    # the recorded command names no path of this machine: the records travel with a report rebuilt elsewhere
    assert record["command"][:2] == ["python", "recipes/glue.py"]
    assert record["command"][-2:] == ["--output_dir", f"runs/{record['cell_id']}"]
    assert str(tmp_path) not in json.dumps(record)
    run = tmp_path / "study" / "runs" / record["cell_id"]
    assert sorted(p.name for p in run.iterdir()) == ["all_results.json", "trainer_state.json"]  # weights dropped
    # a second run skips finished and failed cells; --retry_failed runs the failures again
    again = []
    Study(str(tmp_path / "study"), BUDGETS["smoke"], StudySettings(), tasks=["sentiment"], methods=["bitfit", "full"],
          seeds=[1, 2], recipes_dir=str(recipes)).run(progress=False, echo=again.append)
    assert "3 finished (skipped), 3 failed before" in again[0] and "0 to run" in again[0]
    retry = Study(str(tmp_path / "study"), BUDGETS["smoke"], StudySettings(), tasks=["sentiment"],
                  methods=["bitfit", "full"], seeds=[1, 2], recipes_dir=str(recipes), retry_failed=True)
    assert sum(s.status == "pending" for s in retry.states()) == 3


RENDEZVOUS_RECIPE = '''
import glob, json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--output_dir") + 1]
meeting = os.path.join(os.path.dirname(os.path.dirname(out)), "meeting")
os.makedirs(meeting, exist_ok=True)
open(os.path.join(meeting, os.path.basename(out)), "w").close()
deadline = time.time() + 60
while len(glob.glob(os.path.join(meeting, "*"))) < 2:  # waits for a second cell running at the same time
    if time.time() > deadline:
        print("glue.py: error: no other cell ran beside this one", file=sys.stderr)
        sys.exit(3)
    time.sleep(0.05)
os.makedirs(out, exist_ok=True)
seed = int(args[args.index("--seed") + 1])
json.dump({"eval_accuracy": 0.5 + seed / 100, "train_runtime": 1.0}, open(os.path.join(out, "all_results.json"), "w"))
json.dump({"log_history": []}, open(os.path.join(out, "trainer_state.json"), "w"))
json.dump({"omp": os.environ.get("OMP_NUM_THREADS")}, open(os.path.join(out, "threads.json"), "w"))
'''


def test_jobs_run_cells_side_by_side_with_a_share_of_the_cores(tmp_path, monkeypatch):
    """--jobs 2: each stand-in cell waits until a second one has started (one at a time it would fail)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "glue.py").write_text(RENDEZVOUS_RECIPE)
    study = Study(str(tmp_path / "study"), BUDGETS["smoke"], StudySettings(), tasks=["sentiment"], methods=["bitfit"],
                  seeds=[1, 2], recipes_dir=str(recipes))
    lines = []
    states = study.run(progress=False, echo=lines.append, jobs=2)
    assert [s.status for s in states] == ["done"] * 3, [s.record.get("error") for s in states]
    assert sorted(line.split("]")[0] for line in lines[1:]) == ["[1/3", "[2/3", "[3/3"]
    assert all(s.record["peak_rss_mb"] > 0 for s in states)  # each child's own usage, as one at a time
    cores = len(os.sched_getaffinity(0))
    for state in states:
        threads = json.loads((tmp_path / "study" / "runs" / state.cell_id / "threads.json").read_text())
        assert threads["omp"] == str(max(1, cores // 2))
    with pytest.raises(StudyError, match="--jobs 0: must be at least 1"):
        study.run(progress=False, echo=lines.append, jobs=0)


SLEEPING_RECIPE = '''
import os, sys, time
args = sys.argv[1:]
out = args[args.index("--output_dir") + 1]
pids = os.path.join(os.path.dirname(os.path.dirname(out)), "pids")
os.makedirs(pids, exist_ok=True)
open(os.path.join(pids, str(os.getpid())), "w").close()
time.sleep(120)
'''


def _interruptible():
    """The study as a terminal starts it: SIGINT at its default and unblocked. An ignored SIGINT is inherited
    across exec (and an earlier test of the same pytest process may have left it so), and Python then never
    raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_with_jobs_stops_every_running_cell_and_records_none(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "glue.py").write_text(SLEEPING_RECIPE)
    out = tmp_path / "study"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bitfit_hf.study", "--budget", "smoke", "--tasks", "sentiment", "--methods", "bitfit",
         "--recipes_dir", str(recipes), "--output_dir", str(out), "--no-progress", "--jobs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible)
    deadline = time.time() + 60
    while len(list((out / "pids").glob("*")) if (out / "pids").is_dir() else []) < 2:
        assert time.time() < deadline and proc.poll() is None, "two cells did not start side by side"
        time.sleep(0.1)
    children = [int(p.name) for p in (out / "pids").iterdir()]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted: finished cells are kept" in err and "Traceback" not in err
    time.sleep(0.5)
    for pid in children:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as handle:  # only a zombie may be left
            assert handle.read().split()[2] == "Z", f"cell process {pid} still runs"
    assert not list((out / "cells").glob("*.json")) if (out / "cells").exists() else True


SWEEP_RECIPE = '''
import json, math, os, sys
args = sys.argv[1:]
out = args[args.index("--output_dir") + 1]
os.makedirs(out, exist_ok=True)
seed = int(args[args.index("--seed") + 1])
rate = float(args[args.index("--learning_rate") + 1]) if "--learning_rate" in args else None
if "--dev_split_from_train" in args:  # the sweep: best dev score at 3e-3
    accuracy = 0.9 - 0.1 * abs(math.log10(rate / 3e-3))
else:
    accuracy = 0.8 + seed / 100
json.dump({"eval_accuracy": accuracy, "predict_accuracy": 0.95, "train_runtime": 1.0, "train_loss": 0.5},
          open(os.path.join(out, "all_results.json"), "w"))
history = [{"epoch": 0.5, "loss": 0.7, "step": 5}, {"epoch": 1.0, "loss": 0.3, "step": 10}]
json.dump({"log_history": history}, open(os.path.join(out, "trainer_state.json"), "w"))
json.dump({"rate": rate}, open(os.path.join(out, "rate.json"), "w"))
'''


def test_the_sweep_runs_first_and_its_choice_trains_the_main_cells_in_the_same_invocation(tmp_path):
    from bitfit_hf.study.budgets import Budget, SweepBudget, TaskBudget
    from bitfit_hf.study.report import write_report

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "glue.py").write_text(SWEEP_RECIPE)
    budget = Budget("t", "a stand-in sweep", {"sentiment": TaskBudget(16, (1, 2), ("bitfit",), ("lora",), epochs=1.0,
                                                                       eval_samples=16, train_score_samples=8,
                                                                       dev_samples=8)},
                    curve=None, min_steps=1, sweep=SweepBudget(rates=(("bitfit", (1e-3, 3e-3, 1e-2)),)))
    study = Study(str(tmp_path / "study"), budget, StudySettings(), recipes_dir=str(recipes))
    before = study.states()
    assert [s.status for s in before].count("waiting for the learning-rate sweep") == 2
    lines = []
    states = study.run(progress=False, echo=lines.append, max_cells=2)  # part of the sweep only
    assert "2 waiting for the learning-rate sweep" in lines[0] and sum(s.status == "done" for s in states) == 2
    lines = []
    states = study.run(progress=False, echo=lines.append)
    assert any("the sweep chose learning rates: 2 more cell(s) to run" in line for line in lines)
    main = [s for s in states if s.cell.stage == "main" and s.cell.method == "bitfit"]
    assert [s.status for s in main] == ["done", "done"] and all(s.cell.learning_rate == 3e-3 for s in main)
    for state in main:
        assert json.loads((tmp_path / "study" / "runs" / state.cell_id / "rate.json").read_text())["rate"] == 3e-3
        assert state.record["final_train_loss"] == 0.3 and state.record["learning_rate"] == 3e-3
    lora = next(s for s in states if s.cell.method == "lora")
    assert lora.status == "done" and lora.cell.learning_rate is None  # a cost row: the recipe's default rate
    constants = {"sentiment": {"rule": "the most frequent class", "validation": {"score": 50.0, "n": 16},
                               "train": {"score": 50.0, "n": 8}, "dev": {"score": 50.0, "n": 8}}}
    results = write_report(study.output_dir, study.states(), budget, study.settings, param_counts={},
                           constants=constants)
    (entry,) = results["sweep"]
    assert entry["chosen"] == 3e-3 and not entry["edge"] and [r["rate"] for r in entry["rates"]] == [1e-3, 3e-3, 1e-2]
    assert results["grid"]["sentiment"]["bitfit"]["learning_rate"] == 3e-3
    report = (tmp_path / "study" / "report.md").read_text()
    assert "| sentiment | BitFit (all biases) | 0.001: 85.23 (85.23); **0.003: 90.00** (90.00); 0.01: 84.77 (84.77) | 0.003 |" \
        in report
    assert "## Constant predictors and the validity gate" in report and "> 55.00" in report
    assert "s1 81.00 ✓, fits" in report and "seed noise" in report and "validity gate" in report


def test_sweep_factors_widen_the_grid_from_the_command_line(tmp_path, capsys):
    from bitfit_hf.cli.main import main as cli_main
    from bitfit_hf.recipe_kit.args import DEFAULT_LEARNING_RATES

    out_dir = str(tmp_path / "s")
    assert cli_main(["study", "--dry-run", "--sweep_factors", "0.3", "1", "3", "10", "--output_dir", out_dir]) == 0
    out = capsys.readouterr().out
    low = float(f"{DEFAULT_LEARNING_RATES['bitfit'] * 0.3:.3g}")
    assert f"sweep-sentiment-bitfit-n400-lr{low:g}-s1" in out  # the added lower rate is a cell of the sweep
    assert f"sweep-sentiment-bitfit-n400-lr{DEFAULT_LEARNING_RATES['bitfit']:g}-s1" in out
    assert not (tmp_path / "s").exists()
    for bad, message in ((["--sweep_factors", "0", "1"], "positive"), (["--sweep_factors", "1", "--no_sweep"], "--no_sweep")):
        assert cli_main(["study", "--dry-run", *bad, "--output_dir", out_dir]) == 2
        assert message in capsys.readouterr().err


def test_the_report_says_where_its_cells_ran_when_it_is_rebuilt_elsewhere():
    from bitfit_hf.study.machine import cell_environments
    from bitfit_hf.study.markdown import machine_lines

    gpu = {"platform": "Linux-6.18-x86_64", "cpu_count": 16, "cuda": "NVIDIA H200", "python": "3.12.3",
           "torch": "2.11.0+cu130", "transformers": "5.24.0"}
    here = {**gpu, "cpu_count": 2, "cuda": None, "torch": "2.13.0+cpu"}
    records = [{"environment": gpu}, {"environment": gpu}, {}]  # the last: a record from before cells carried one
    assert cell_environments(records) == [{"environment": gpu, "cells": 2}]
    lines = machine_lines({"environment": here, "cell_environments": cell_environments(records)})
    assert lines[0].startswith("* cells ran on: Linux-6.18-x86_64, 16 CPUs, GPU NVIDIA H200") and "(2 cells)" in lines[0]
    assert lines[1].startswith("* report written on: Linux-6.18-x86_64, 2 CPUs; python 3.12.3, torch 2.13.0+cpu")
    # written where the cells ran: one line; no record with an environment: the report's machine, as before
    assert machine_lines({"environment": gpu, "cell_environments": cell_environments(records)}) == [
        "* machine: Linux-6.18-x86_64, 16 CPUs, GPU NVIDIA H200; python 3.12.3, torch 2.11.0+cu130, transformers 5.24.0"]
    assert machine_lines({"environment": here, "cell_environments": []})[0].startswith("* machine: Linux-6.18-x86_64, 2 CPUs")


def test_a_report_of_cuda_cells_can_be_rebuilt_on_a_machine_without_a_gpu(monkeypatch, tmp_path):
    import torch

    from bitfit_hf.study import command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    for flag in ("--report_only", "--dry-run"):
        args = parser.parse_args(["--device", "cuda", flag, "--output_dir", str(tmp_path)])
        assert command._study(args).settings.device == "cuda"  # the cells' identity keeps the device
    with pytest.raises(command.StudyError, match="no CUDA device"):  # running cells still needs one
        command._study(parser.parse_args(["--device", "cuda", "--output_dir", str(tmp_path)]))
