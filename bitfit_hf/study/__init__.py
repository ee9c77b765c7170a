"""Reproduce the BitFit paper's findings with one command: a grid of real recipe runs and a report.

* :mod:`~bitfit_hf.study.budgets`: tasks, method rows (a recipe ``--method`` plus flags), budgets;
* :mod:`~bitfit_hf.study.grid`: the cells a budget expands to, each with its exact command;
* :mod:`~bitfit_hf.study.state`: where a planned cell stands;
* :mod:`~bitfit_hf.study.sweep`: the learning rate each swept row trains at, from the sweep's dev scores;
* :mod:`~bitfit_hf.study.runner`: runs each cell as a recipe subprocess, resumably (the sweep first);
* :mod:`~bitfit_hf.study.outcome`: reads a finished run into the cell's record;
* :mod:`~bitfit_hf.study.aggregate`: records -> tables (mean ± std over seeds, per-seed runs);
* :mod:`~bitfit_hf.study.baselines`: each task's constant predictor on the examples a run is scored on;
* :mod:`~bitfit_hf.study.gates`: which runs a comparison may use (beat the constant, fit the training set);
* :mod:`~bitfit_hf.study.compare`: differences paired over seeds, judged against seed noise;
* :mod:`~bitfit_hf.study.claims`: the paper's claims 1-8 and the rules that judge them;
* :mod:`~bitfit_hf.study.param_counts`: claim 1 from model configurations alone;
* :mod:`~bitfit_hf.study.results` (the content of ``results.json``), :mod:`~bitfit_hf.study.markdown` (``report.md``),
  :mod:`~bitfit_hf.study.figures` (PNGs) and :mod:`~bitfit_hf.study.report` (writes them);
* :mod:`~bitfit_hf.study.command`: ``python -m bitfit_hf.study`` and ``bitfit-hf study``.
"""
