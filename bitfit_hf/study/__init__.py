"""Reproduce the BitFit paper's findings with one command: a grid of real recipe runs and a report.

* :mod:`~bitfit_hf.study.grid`: tasks, method rows (a recipe ``--method`` plus flags), budgets, cells;
* :mod:`~bitfit_hf.study.runner`: runs each cell as a recipe subprocess, resumably;
* :mod:`~bitfit_hf.study.outcome`: reads a finished run into the cell's record;
* :mod:`~bitfit_hf.study.aggregate`: records -> tables (mean ± std over seeds);
* :mod:`~bitfit_hf.study.claims`: the paper's claims 1-8 and the rules that judge them;
* :mod:`~bitfit_hf.study.param_counts`: claim 1 from model configurations alone;
* :mod:`~bitfit_hf.study.report` / :mod:`~bitfit_hf.study.figures`: ``report.md``, ``results.json``, PNGs;
* :mod:`~bitfit_hf.study.command`: ``python -m bitfit_hf.study`` and ``bitfit-hf study``.
"""
