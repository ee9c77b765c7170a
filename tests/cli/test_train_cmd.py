"""``bitfit-hf train RECIPE ...``: the verb runs the shipped recipe with the flags unchanged, lists the recipes, and
refuses an unknown one in one line; a built wheel carries the recipes and the model card templates."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from bitfit_hf.cli import train_cmd
from bitfit_hf.cli.main import main

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "bitfit_hf.cli"]


def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, **kwargs)


def test_help_lists_every_recipe_with_its_summary():
    res = run_cli("train", "--help")
    assert res.returncode == 0, res.stderr
    assert "usage: bitfit-hf train" in res.stdout
    for name in train_cmd.RECIPES:
        assert f"  {name} " in res.stdout
    assert "BitFit on GLUE" in res.stdout and "extractive question answering" in res.stdout


def test_recipe_help_is_the_recipes_own():
    res = run_cli("train", "glue", "--help")
    assert res.returncode == 0, res.stderr
    assert "usage: bitfit-hf train glue" in res.stdout  # the words that ran it (python recipes/glue.py: glue.py)
    for flag in ("--method", "--train_file", "--validation_file", "--learning_rate"):
        assert flag in res.stdout


def test_unknown_recipe_is_one_error_line(capsys):
    assert main(["train", "mrpc", "--method", "lora"]) == 2
    err = capsys.readouterr().err
    assert err == ("bitfit-hf train: error: unknown recipe 'mrpc'; choose one of: glue, pos, squad, clm "
                   "(bitfit-hf train --help).\n")


def test_no_recipe_prints_the_help_and_fails(capsys):
    assert main(["train"]) == 2
    assert "recipes:" in capsys.readouterr().err


def test_flags_reach_the_recipe_unchanged(monkeypatch):
    """The verb becomes ``python <package>/recipes/pos.py FLAGS`` (exec'd: no training here)."""
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    flags = ["--method", "lora", "--learning_rate", "1e-3", "--output_dir", "out dir", "--help"]
    assert main(["train", "pos", *flags]) in (0, None)
    ((path, argv, env),) = calls
    assert env["BITFIT_HF_PROG"] == "bitfit-hf train pos" and "BITFIT_HF_PROG" not in os.environ
    assert path == sys.executable and argv[0] == sys.executable and argv[2:] == flags
    assert Path(argv[1]).resolve() == (REPO / "recipes" / "pos.py").resolve()


def test_path_prints_the_script(capsys):
    assert main(["train", "--path", "squad"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.resolve() == (REPO / "recipes" / "squad.py").resolve()


def test_recipes_folder_falls_back_to_the_checkout(monkeypatch, tmp_path):
    """A checkout whose ``bitfit_hf/recipes`` symlink did not survive (Windows) still finds ``recipes/``."""
    package = tmp_path / "bitfit_hf"
    (package / "cli").mkdir(parents=True)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "glue.py").write_text('"""x"""\n')
    monkeypatch.setattr(train_cmd, "__file__", str(package / "cli" / "train_cmd.py"))
    assert train_cmd.recipes_dir() == tmp_path / "recipes"
    (tmp_path / "recipes" / "glue.py").unlink()
    assert train_cmd.recipes_dir() is None
    with pytest.raises(train_cmd.CliError, match="missing from this bitfit-hf install"):
        train_cmd.recipe_path("glue")


@pytest.mark.slow
def test_built_wheel_ships_the_recipes_and_model_cards(tmp_path):
    """Build the wheel from a copy of the checkout (no build/ or egg-info left in it), check what it holds, install it
    in a fresh virtual environment and run its `bitfit-hf train`: the recipe found is the installed wheel's own."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "outputs")
    for name in ("bitfit_hf", "recipes", "model_cards"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=ignore)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                            "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp_path / "dist").glob("bitfit_hf-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for recipe in train_cmd.RECIPES:
            assert archive.read(f"bitfit_hf/recipes/{recipe}.py") == (REPO / "recipes" / f"{recipe}.py").read_bytes()
        templates = sorted(p.name for p in (REPO / "model_cards").glob("*.md"))
        assert templates and all(f"bitfit_hf/model_cards/{t}" in names for t in templates)
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
        assert any(line.startswith("Requires-Dist: peft") and "extra ==" not in line for line in requires), requires
    # A fresh virtual environment with the wheel installed as pip installs it (its `bitfit-hf` script included). Its
    # dependencies come from this environment's site-packages, appended after its own by a .pth file: no network,
    # and this checkout's editable install is not seen (a .pth inside a path added that way is not read).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                              "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = [str(venv / "bin" / "bitfit-hf")]
    where = subprocess.run([*script, "train", "--path", "glue"], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env=env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()) == Path(site) / "bitfit_hf" / "recipes" / "glue.py"
    res = subprocess.run([*script, "train", "glue", "--help"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=env)
    assert res.returncode == 0 and "--method" in res.stdout, res.stderr
