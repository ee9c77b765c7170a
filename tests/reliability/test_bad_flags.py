"""Bad recipe flags end in one ``error:`` line and exit status 2, never a traceback: a role the
architecture lacks, an invalid --bias_patterns regex, a --model_name_or_path that does not exist,
--resume_from_checkpoint last with no complete checkpoint, --push_to_hub with the Hub out of reach."""

from __future__ import annotations

import subprocess
import sys

import pytest
from reliability_support import REPO, SECRET, python_env

from bitfit_hf.recipe_kit import run as recipe_run

sys.path.insert(0, str(REPO / "tests" / "recipes"))
from recipe_support import load_recipe  # noqa: E402

SMALL = ["--max_train_samples", "8", "--max_eval_samples", "8", "--per_device_eval_batch_size", "8"]


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """None of these runs may get as far as a training step."""
    from bitfit_hf.hub.trainer import BitFitTrainer

    def refuse(self, *args, **kwargs):
        raise AssertionError("a training step ran despite the bad flag")

    monkeypatch.setattr(BitFitTrainer, "training_step", refuse)


def run_recipe(capsys, tmp_path, recipe: str, *argv: str) -> str:
    """``recipes/<recipe>.py ARGV`` through its command-line entry; returns stderr after exit 2."""
    main = load_recipe(recipe).main
    with pytest.raises(SystemExit) as exit_info:
        recipe_run.cli_entry(lambda: main(["--output_dir", str(tmp_path / "out"), *argv]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def test_a_role_the_architecture_lacks(capsys, tmp_path):
    line = run_recipe(capsys, tmp_path, "glue", "--bias_terms", "b_xq", *SMALL)
    assert "Role 'b_xq' selects no parameter of this bert model" in line
    assert "This architecture has the roles: b_q, b_k" in line


def test_an_invalid_bias_pattern(capsys, tmp_path):
    line = run_recipe(capsys, tmp_path, "glue", "--bias_patterns", "(", *SMALL)
    assert "Invalid regular expression in patterns: '('" in line


def test_a_model_path_that_does_not_exist(capsys, tmp_path):
    line = run_recipe(capsys, tmp_path, "glue", "--model_name_or_path", str(tmp_path / "nonexistent"), *SMALL)
    assert "--model_name_or_path" in line and "no such directory" in line
    assert "Repo id must use alphanumeric" not in line


def test_resume_last_with_only_an_interrupted_checkpoint(capsys, tmp_path):
    (tmp_path / "out" / "checkpoint-12").mkdir(parents=True)
    line = run_recipe(capsys, tmp_path, "glue", "--resume_from_checkpoint", "last", "--eval_before_training", "false",
                      *SMALL)
    assert "no complete checkpoint to resume from" in line and "checkpoint-12 was interrupted" in line


@pytest.mark.slow
def test_push_to_hub_with_the_hub_out_of_reach(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, str(REPO / "recipes" / "glue.py"), "--output_dir", str(tmp_path / "out"), *SMALL,
         "--push_to_hub", "--hub_model_id", "me/unreachable", "--hub_token", SECRET],
        cwd=REPO, env=python_env(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HUB_OFFLINE="0", HF_HOME=str(tmp_path / "hf"),
                                 NO_PROXY="127.0.0.1", no_proxy="127.0.0.1"),
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Cannot reach the Hub" in errors[0], proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize("flag,value,expected", [
    ("--per_device_train_batch_size", "0", "--per_device_train_batch_size 0: must be at least 1."),
    ("--gradient_accumulation_steps", "0", "--gradient_accumulation_steps 0: must be at least 1."),
    ("--learning_rate", "-1", "--learning_rate -1.0: must not be negative."),
])
def test_a_number_that_would_only_fail_inside_training(capsys, tmp_path, flag, value, expected):
    line = run_recipe(capsys, tmp_path, "glue", flag, value, *SMALL)
    assert line.endswith(f"error: {expected}")


def test_an_output_dir_that_cannot_be_made_and_nothing_is_left(capsys, tmp_path):
    (tmp_path / "a-file").write_text("")
    line = run_recipe(capsys, tmp_path, "glue", *SMALL, "--output_dir", str(tmp_path / "a-file" / "run"))
    assert f"--output_dir '{tmp_path / 'a-file' / 'run'}': its parent '{tmp_path / 'a-file'}' is not a folder" in line
    line = run_recipe(capsys, tmp_path, "glue", *SMALL, "--output_dir", str(tmp_path / "new" / "run"),
                      "--bias_terms", "b_zz")  # a later error: the checked output folder was not left behind
    assert "b_zz" in line and not (tmp_path / "new").exists()


def test_a_method_config_error_names_the_flag_behind_it(capsys, tmp_path):
    line = run_recipe(capsys, tmp_path, "glue", "--layerwise_lr_decay", "1.5", *SMALL)
    assert "error: --layerwise_lr_decay: layerwise_lr_decay must be in (0, 1]" in line and "--bias_patterns" not in line
    line = run_recipe(capsys, tmp_path, "glue", "--method", "rand_uniform", "--match_bias_terms", "b_zz", *SMALL)
    assert "error: --match_bias_terms: Unknown bias term(s) ['b_zz']" in line


@pytest.mark.parametrize("recipe,flag", [("glue", "--max_seq_length"), ("pos", "--max_seq_length"), ("clm", "--block_size")])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_length_that_is_not_positive(capsys, tmp_path, recipe, flag, value):
    line = run_recipe(capsys, tmp_path, recipe, flag, value, *SMALL)
    assert line.endswith(f"error: {flag} must be positive (got {value}).")
