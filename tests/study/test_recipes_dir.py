"""Where the study finds the recipes: a source checkout's recipes/, else the copy shipped in the installed package."""

from __future__ import annotations

from pathlib import Path

import pytest

from bitfit_hf.study.runner import RECIPES_ENV, StudyError, find_recipes_dir
from bitfit_hf.utils import cell_runs

REPO = Path(__file__).resolve().parents[2]


def test_the_checkout_first(monkeypatch):
    monkeypatch.delenv(RECIPES_ENV, raising=False)
    assert find_recipes_dir() == str(REPO / "recipes")


def test_an_installed_wheel_uses_its_shipped_recipes(tmp_path, monkeypatch):
    monkeypatch.delenv(RECIPES_ENV, raising=False)
    package = tmp_path / "site-packages" / "bitfit_hf"
    (package / "recipes").mkdir(parents=True)
    (package / "recipes" / "glue.py").write_text("")
    monkeypatch.setattr(cell_runs, "__file__", str(package / "utils" / "cell_runs.py"))  # where it looks from
    assert find_recipes_dir() == str(package / "recipes")
    (package / "recipes" / "glue.py").unlink()
    with pytest.raises(StudyError, match="--recipes_dir"):
        find_recipes_dir()
