"""bitfit-hf: BitFit (bias-only fine-tuning, Ben Zaken et al., ACL 2022) for the Hugging Face stack.

Names are imported lazily, so ``python -m bitfit_hf.assets`` and friends start without loading torch
and transformers.
"""

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "BitFitAdapter": "adapter",
    "load_adapter": "adapter",
    "save_adapter": "adapter",
    "AdapterConfig": "adapter_config",
    "AdapterError": "adapter_config",
    "BaseModelMismatchError": "adapter_config",
    "AutoBitFitModel": "auto",
    "AdapterBank": "bank",
    "BitFitConfig": "config",
    "export_merged": "export",
    "BitFitState": "model",
    "apply_bitfit": "model",
    "get_bitfit_state": "model",
    "MultiTaskModel": "multitask",
    "MultiTaskOutput": "multitask",
    "ALL_ROLES": "roles",
    "PAPER_ROLES": "roles",
    "PRESETS": "roles",
    "Selection": "selection",
    "resolve": "selection",
    "TrainableSummary": "summary",
    "BitFitTrainer": "trainer",
    "HubError": "hub",
    "download_adapter": "hub",
    "push_adapter_to_hub": "hub",
    "MultiTaskModel": "multitask",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bitfit_hf' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # pragma: no cover
    from .adapter import BitFitAdapter, load_adapter, save_adapter  # noqa: F401
    from .adapter_config import AdapterConfig, AdapterError, BaseModelMismatchError  # noqa: F401
    from .auto import AutoBitFitModel  # noqa: F401
    from .bank import AdapterBank  # noqa: F401
    from .config import BitFitConfig  # noqa: F401
    from .export import export_merged  # noqa: F401
    from .model import BitFitState, apply_bitfit, get_bitfit_state  # noqa: F401
    from .multitask import MultiTaskModel, MultiTaskOutput  # noqa: F401
    from .roles import ALL_ROLES, PAPER_ROLES, PRESETS  # noqa: F401
    from .selection import Selection, resolve  # noqa: F401
    from .summary import TrainableSummary  # noqa: F401
    from .trainer import BitFitTrainer  # noqa: F401
    from .hub import HubError, download_adapter, push_adapter_to_hub  # noqa: F401
    from .multitask import MultiTaskModel  # noqa: F401
