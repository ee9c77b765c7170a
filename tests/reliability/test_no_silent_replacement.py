"""A run never silently replaces another run's outputs: an ``--output_dir`` holding an earlier run's adapter,
checkpoints or results is refused (one ``error:`` line, exit 2, before anything is loaded, nothing written)
unless ``--overwrite_output_dir`` is given or the run resumes (``--resume_from_checkpoint``); a folder another
live run holds (``_bitfit_run.lock`` with its pid, created atomically, removed at the end) is refused too, and a
lock whose process is gone is taken over. Every recipe goes through the same check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from reliability_support import REPO

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit import run as recipe_run

sys.path.insert(0, str(REPO / "tests" / "recipes"))
from recipe_support import load_recipe  # noqa: E402

LOCK = "_bitfit_run.lock"
REACHED = "reached the loading step"


@pytest.fixture(autouse=True)
def stop_before_loading(monkeypatch):
    """The runs stop where loading would begin: reaching it means every check before it passed."""
    seen = {}

    def stop(parsed, *args, **kwargs):
        folder = parsed.training.output_dir
        lock = os.path.join(folder, LOCK)
        seen["lock"] = json.loads(open(lock).read()) if os.path.isfile(lock) else None
        raise RecipeError(REACHED)

    monkeypatch.setattr(recipe_run, "fetch_default_assets", stop)
    return seen


def run_recipe(capsys, recipe: str, out, *argv: str) -> str:
    main = load_recipe(recipe).main
    with pytest.raises(SystemExit) as exit_info:
        recipe_run.cli_entry(lambda: main(["--output_dir", str(out), "--max_train_samples", "8", *argv]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def snapshot(root):
    found = {}
    for folder, _dirs, names in os.walk(root):
        found[folder] = os.stat(folder).st_mtime_ns
        for name in names:
            path = os.path.join(folder, name)
            found[path] = (open(path, "rb").read(), os.stat(path).st_mtime_ns)
    return found


def earlier_run(out):
    """What a finished run leaves: an adapter, results and a checkpoint."""
    from reliability_support import tiny_bert

    from bitfit_hf import apply_bitfit, save_adapter

    model = tiny_bert()
    apply_bitfit(model)
    save_adapter(model, str(out / "checkpoint-2"))  # a bitfit checkpoint (all biases), as the default run's
    (out / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (out / "adapter_config.json").write_text('{"method": "bitfit"}')
    (out / "adapter_model.safetensors").write_bytes(b"weights")
    (out / "all_results.json").write_text('{"eval_accuracy": 0.9}')


@pytest.mark.parametrize("recipe", ["glue", "pos", "squad", "clm"])
def test_an_earlier_run_is_never_replaced_silently(capsys, tmp_path, recipe):
    out = tmp_path / "out"
    earlier_run(out)
    before = snapshot(tmp_path)
    line = run_recipe(capsys, recipe, out)
    assert f"--output_dir '{out}' already holds an earlier run's files" in line
    assert "--overwrite_output_dir" in line and "--resume_from_checkpoint" in line
    assert snapshot(tmp_path) == before  # nothing written, not even a lock


def test_overwrite_output_dir_or_a_resume_lets_the_run_start(capsys, tmp_path, stop_before_loading):
    out = tmp_path / "out"
    earlier_run(out)
    assert run_recipe(capsys, "glue", out, "--overwrite_output_dir").endswith(REACHED)
    assert stop_before_loading["lock"]["pid"] == os.getpid()  # held while the run works
    assert not (out / LOCK).exists()  # and removed at its end
    assert run_recipe(capsys, "glue", out, "--resume_from_checkpoint", str(out / "checkpoint-2")).endswith(REACHED)


def test_an_empty_or_new_folder_is_fine_and_a_new_one_is_not_left_behind(capsys, tmp_path, stop_before_loading):
    (tmp_path / "empty").mkdir()
    assert run_recipe(capsys, "glue", tmp_path / "empty").endswith(REACHED)
    assert (tmp_path / "empty").is_dir() and os.listdir(tmp_path / "empty") == []
    assert run_recipe(capsys, "glue", tmp_path / "new" / "run").endswith(REACHED)
    assert stop_before_loading["lock"]["pid"] == os.getpid()
    assert not (tmp_path / "new").exists()  # the run failed before writing anything: no empty folder left


def test_a_folder_another_live_run_holds_is_refused(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        (out / LOCK).write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(), "started": "earlier"}))
        before = snapshot(tmp_path)
        line = run_recipe(capsys, "glue", out, "--overwrite_output_dir")
        assert f"--output_dir '{out}' is in use by another run (pid {other.pid}" in line
        assert snapshot(tmp_path) == before
    finally:
        other.kill()
        other.wait()


def test_a_lock_whose_run_is_gone_is_taken_over(capsys, tmp_path, stop_before_loading):
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "earlier"}))
    assert run_recipe(capsys, "glue", out).endswith(REACHED)
    assert stop_before_loading["lock"]["pid"] == os.getpid()
    assert not (out / LOCK).exists()


def test_the_flag_exists_whatever_the_transformers_version():
    from bitfit_hf.recipe_kit.args import parse_recipe_args

    recipe = load_recipe("glue")
    parsed = parse_recipe_args(recipe.GlueDataArguments, recipe.DEFAULTS, ["--output_dir", "x", "--overwrite_output_dir"])
    assert parsed.training.overwrite_output_dir is True
    assert parse_recipe_args(recipe.GlueDataArguments, recipe.DEFAULTS, ["--output_dir", "x"]).training.overwrite_output_dir is False
