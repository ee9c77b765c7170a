"""The bias change behind a card's heat map, and its files: where it comes from (given, computed
against a base, stored beside the adapter, or the recorded base when it is at hand locally) and
writing ``bias_change.json`` / ``bias_change.png``.

Separate from :mod:`bitfit_hf.reporting.heatmap`, which computes and draws a :class:`BiasChange`, and
from :mod:`bitfit_hf.reporting.model_card`, which only shows it: this module decides which change an
adapter folder or a Hub push gets, and writes it.
"""

from __future__ import annotations

import logging
import os
from typing import List, Mapping, Optional

from bitfit_hf.adapters.base_checkpoint import read_checkpoint_biases
from bitfit_hf.adapters.config import AdapterConfig
from bitfit_hf.reporting.heatmap import BiasChange, classify
from bitfit_hf.utils.constants import BIAS_CHANGE_JSON, BIAS_CHANGE_PNG

logger = logging.getLogger(__name__)


def write_bias_change_files(directory: str, change: Optional[BiasChange], config: AdapterConfig,
                            repo_id: Optional[str] = None) -> List[str]:
    """``bias_change.json`` and (with matplotlib) ``bias_change.png`` for ``change``; the names written."""
    if change is None:
        return []
    change.save(os.path.join(directory, BIAS_CHANGE_JSON))
    written = [BIAS_CHANGE_JSON]
    if change.roles:
        try:
            change.plot(os.path.join(directory, BIAS_CHANGE_PNG), title=_plot_title(config, repo_id))
            written.append(BIAS_CHANGE_PNG)
        except ImportError as err:
            logger.warning("%s The card shows the bias change as a table only.", err)
    return written


def resolve_bias_change(adapter, directory: Optional[str] = None, base=None, bias_change=None) -> Optional[BiasChange]:
    """The adapter's bias change: given, computed against ``base``, stored in ``directory``, or
    computed against the recorded base when it is at hand locally; else ``None``."""
    if isinstance(bias_change, BiasChange):
        return bias_change
    if isinstance(bias_change, Mapping):
        return BiasChange.from_dict(bias_change)
    if base is not None:
        return BiasChange.compute(base, adapter)
    stored = os.path.join(directory, BIAS_CHANGE_JSON) if directory else None
    if stored and os.path.isfile(stored):
        try:
            return BiasChange.load(stored)
        except (OSError, ValueError) as err:
            logger.warning("Ignoring %s: %s", stored, err)
    return bias_change_from_recorded_base(adapter)


def bias_change_from_recorded_base(adapter) -> Optional[BiasChange]:
    """The bias change against the base the adapter records, read from a local folder or the Hub
    cache only (never downloaded for a card); ``None`` when it is not at hand."""
    cfg = adapter.config
    source = cfg.base_model_name_or_path
    if not source:
        return None
    names = [entry[0] for entry in classify(cfg)]
    if not names:
        return None
    try:
        if os.path.isdir(source):
            tensors = read_checkpoint_biases(source, names)
        else:
            tensors = read_checkpoint_biases(source, names, revision=cfg.base_model_revision, local_files_only=True)
        return BiasChange.compute(tensors, adapter)
    except Exception as err:  # noqa: BLE001 - the heat map is optional; say why it is missing
        logger.info("No bias-change heat map: the base %r is not at hand (%s).", source, type(err).__name__)
        return None


def _plot_title(cfg: AdapterConfig, repo_id: Optional[str]) -> str:
    name = (repo_id or "").split("/")[-1] or cfg.architecture
    return f"{name}: bias change per layer, (1/dim)·‖b0 − bF‖₁"
