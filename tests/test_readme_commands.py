"""The README's commands, the Makefile and .ci/run cannot drift apart: CI runs `make test`, which the README
names, and `make` runs exactly the README's set-up-by-hand and test commands (read with `make -n`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP_COMMANDS = "## Two commands"
BY_HAND = "## Set-up by hand"


def readme_blocks() -> dict[str, list[list[str]]]:
    """Commands of the fenced bash blocks, grouped by the `## ` section they are in (comments dropped)."""
    sections: dict[str, list[list[str]]] = {}
    heading, fenced = None, False
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = line.strip() == "```bash" if not fenced else False
            continue
        if not fenced and line.startswith("## "):
            heading = line.strip()
        elif fenced and heading and shlex.split(line, comments=True):
            sections.setdefault(heading, []).append(shlex.split(line, comments=True))
    return {h: cmds for h, cmds in sections.items()}


def section(blocks: dict[str, list[list[str]]], prefix: str) -> list[list[str]]:
    (found,) = [cmds for heading, cmds in blocks.items() if heading.startswith(prefix)]
    return found


def ci_commands() -> list[list[str]]:
    commands = []
    for line in (REPO / ".ci" / "run").read_text().splitlines():
        tokens = shlex.split(line, comments=True)
        if tokens and tokens[0] not in ("set", "cd", "export"):  # shell options and the working folder
            commands.append(tokens)
    return commands


def make_dry_run(target: str, tmp_path: Path, **variables: str) -> list[list[str]]:
    """What `make <target>` would run in a fresh checkout (no .venv yet), as the README writes it:
    `.venv/bin/python -m pip` is `pip`, `.venv/bin/X` is `X`; creating the venv, stamp files and
    environment settings (`PIP_RETRIES=1 ...`) left out."""
    if shutil.which("make") is None:
        pytest.skip("GNU make is not installed")
    venv = tmp_path / "venv"
    args = ["make", "-n", "--no-print-directory", target, f"VENV={venv}", *(f"{k}={v}" for k, v in variables.items())]
    # Run under `make test` too: the outer make's flags and variables must not reach this one.
    outer = {"MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES", "TORCH_SPEC", "CONSTRAINTS", "CUDA_GPU", "PYTHON"}
    env = {k: v for k, v in os.environ.items() if k not in outer}
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    commands = []
    for line in proc.stdout.splitlines():
        tokens = shlex.split(line)
        while tokens and re.fullmatch(r"[A-Z_]+=\S*", tokens[0]):  # environment settings, not commands
            tokens = tokens[1:]
        if not tokens or tokens[0] == "touch" or tokens[1:3] == ["-m", "venv"]:
            continue
        if tokens[0].startswith(f"{venv}/bin/"):
            tokens[0] = tokens[0].rsplit("/", 1)[1]
            if tokens[:3] == ["python", "-m", "pip"]:
                tokens = tokens[2:]
        commands.append(tokens)
    return commands


def test_ci_runs_the_readme_test_command():
    two = section(readme_blocks(), SETUP_COMMANDS)
    assert two == [["make", "demo"], ["make", "test"]]
    assert ci_commands() == [["make", "test"]]


def test_make_test_runs_the_readme_commands_by_hand(tmp_path):
    by_hand = [cmd for cmd in section(readme_blocks(), BY_HAND) if cmd[:2] != ["accelerate", "launch"]]
    assert make_dry_run("test", tmp_path, CUDA_GPU="no") == by_hand
    assert by_hand[-1] == ["python", "-m", "pytest", "--all"] and ["ruff", "check", "."] in by_hand
    # every pinned asset source is looked up on the index before anything is fetched or tested
    assert by_hand.index(["bitfit-hf", "assets", "check"]) < by_hand.index(["bitfit-hf", "assets", "fetch"])


def test_make_demo_installs_the_readme_torch_and_runs_the_main_job(tmp_path):
    by_hand = section(readme_blocks(), BY_HAND)
    demo = make_dry_run("demo", tmp_path, CUDA_GPU="no")
    assert demo[0] == by_hand[0]  # the CPU torch
    assert demo[1] == ["pip", "install", "-e", ".", "-c", "constraints-cpu.txt"]
    assert [cmd for cmd in by_hand if cmd[:2] == ["accelerate", "launch"]] == [["accelerate", "launch", "recipes/glue.py"]]
    # the demo is the README's main job, re-runnable: it replaces its own earlier output
    assert demo[2:] == [["accelerate", "launch", "recipes/glue.py", "--overwrite_output_dir"]]


def test_gpu_machines_get_the_default_torch_and_no_constraint(tmp_path):
    gpu = make_dry_run("test", tmp_path, CUDA_GPU="yes")
    assert gpu[0] == ["pip", "install", "torch==2.13.0"]
    assert all("constraints-cpu.txt" not in cmd for cmd in gpu)
    readme = (REPO / "README.md").read_text()
    assert re.search(r"with a CUDA GPU: pip install torch==2\.13\.0\b", readme)
    chosen = make_dry_run("demo", tmp_path, CUDA_GPU="no", TORCH_SPEC="torch==2.12.0")
    assert chosen[:2] == [["pip", "install", "torch==2.12.0"], ["pip", "install", "-e", "."]]
