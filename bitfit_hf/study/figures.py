"""The report's figures, drawn with matplotlib's Agg canvas (no display) and written atomically."""

from __future__ import annotations

from typing import Any, Dict, Optional

from bitfit_hf.utils.io import atomic_path

__all__ = ["plot_curve", "plot_grid", "plot_bias_change"]

_COLOURS = {"bitfit": "#1f77b4", "full": "#d62728"}


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("The study's figures need matplotlib: pip install 'bitfit-hf[plots]'.") from None
    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str) -> str:
    figure.tight_layout()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", metadata={"Software": None})
    return path


def plot_curve(curve: Dict[str, Any], labels: Dict[str, str], metric_label: str, path: str) -> Optional[str]:
    """Score against training-set size (log axis) for each method, mean ± std over seeds, with the
    BitFit/full crossover marked."""
    if not curve or not any(p["score"]["mean"] is not None for pts in curve["methods"].values() for p in pts):
        return None
    from matplotlib.ticker import NullLocator

    figure = _figure(6.4, 4.2)
    axes = figure.add_subplot(1, 1, 1)
    for method, points in curve["methods"].items():
        points = [p for p in points if p["score"]["mean"] is not None]
        if not points:
            continue
        axes.errorbar([p["size"] for p in points], [p["score"]["mean"] for p in points],
                      yerr=[p["score"]["std"] for p in points], marker="o", capsize=3,
                      color=_COLOURS.get(method), label=labels.get(method, method))
    crossover = curve.get("crossover_size")
    if crossover:
        axes.axvline(crossover, color="grey", linestyle="--", linewidth=1)
        axes.annotate(f"crossover n~{crossover:.0f}", xy=(crossover, 0.02), xycoords=("data", "axes fraction"),
                      rotation=90, ha="right", va="bottom", fontsize=8, color="grey")
    axes.set_xscale("log")
    sizes = sorted({p["size"] for pts in curve["methods"].values() for p in pts})
    axes.set_xticks(sizes)
    axes.set_xticklabels([str(s) for s in sizes])
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xlabel("training examples")
    axes.set_ylabel(f"validation {metric_label}")
    axes.set_title(f"Training-set size, {curve['task']}: BitFit vs full fine-tuning", fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return _save(figure, path)


def plot_grid(grid: Dict[str, Dict[str, Any]], labels: Dict[str, str], path: str) -> Optional[str]:
    """One panel per task: each method's validation score (mean ± std over seeds)."""
    tasks = [t for t, rows in grid.items() if any(e["score"]["mean"] is not None for e in rows.values())]
    if not tasks:
        return None
    from matplotlib.ticker import MaxNLocator

    figure = _figure(4.2 * len(tasks), 4.0)
    for index, task in enumerate(tasks, start=1):
        axes = figure.add_subplot(1, len(tasks), index)
        rows = [(m, e) for m, e in grid[task].items() if e["score"]["mean"] is not None]
        axes.barh(range(len(rows)), [e["score"]["mean"] for _, e in rows], xerr=[e["score"]["std"] for _, e in rows],
                  color=[_COLOURS.get(m, "#7f7f7f") for m, _ in rows], capsize=2)
        axes.set_yticks(range(len(rows)))
        axes.set_yticklabels([labels.get(m, m) for m, _ in rows], fontsize=7)
        axes.invert_yaxis()
        low = min(e["score"]["mean"] - e["score"]["std"] for _, e in rows)
        high = max(e["score"]["mean"] + e["score"]["std"] for _, e in rows)
        pad = max(2.0, 0.15 * (high - low))  # bars differ by a few points: zoom in, but not onto noise
        axes.set_xlim(max(0.0, low - pad), high + pad)
        axes.xaxis.set_major_locator(MaxNLocator(nbins=5))
        axes.set_title(task, fontsize=9)
        axes.set_xlabel("validation score (points)", fontsize=8)
        axes.grid(True, axis="x", alpha=0.3)
    return _save(figure, path)


def plot_bias_change(matrix: Dict[str, Any], tasks, path: str) -> Optional[str]:
    """Figure 1 averaged over tasks, through the library's own heat-map renderer."""
    from bitfit_hf.reporting.heatmap import BiasChange

    change = BiasChange.from_dict(matrix)
    if not change.roles:
        return None
    return change.plot(path, title=f"Bias change per layer, mean over {len(tasks)} task(s)")
