"""bitfit-hf: BitFit (bias-only fine-tuning, Ben Zaken et al., ACL 2022) for the Hugging Face stack.

Layers, each importing only those below it (docs/ARCHITECTURE.md, checked by ``lint-imports``): ``utils`` →
``data`` / ``metrics`` → ``tuners`` (methods) → ``adapters`` (format and loading) → ``inference`` → ``reporting`` →
``training`` → ``hub`` → ``recipe_kit`` → ``study`` / ``serving`` → ``cli``.
Public names are imported lazily, so ``bitfit-hf --help`` starts without loading torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from bitfit_hf.adapters.remote import set_remote_store
from bitfit_hf.inference.registration import register_on_import
from bitfit_hf.utils.constants import __version__

# The composition root: Hub ids given to the adapter layer are served by the Hub client.
set_remote_store("bitfit_hf.hub.client")
# pipeline("question-answering") for encoder QA models, registered when transformers.pipelines is imported
# (at once if it already is): importing bitfit_hf stays free of torch.
register_on_import()

_EXPORTS = {
    "BitFitAdapter": "adapters.adapter",
    "load_adapter": "adapters.adapter",
    "save_adapter": "adapters.adapter",
    "AdapterConfig": "adapters.config",
    "AdapterError": "adapters.config",
    "BaseModelMismatchError": "adapters.config",
    "AutoBitFitModel": "adapters.auto",
    "load_tokenizer": "adapters.auto",
    "AdapterBank": "adapters.bank",
    "export_merged": "adapters.export",
    "export_peft": "adapters.peft_export",
    "MultiTaskModel": "adapters.multitask",
    "MultiTaskOutput": "adapters.multitask",
    "BitFitConfig": "tuners.bias.config",
    "BitFitLoraConfig": "tuners.bitfit_lora.config",
    "BitFitState": "tuners.bias.model",
    "apply_bitfit": "tuners.bias.model",
    "get_bitfit_state": "tuners.state",
    "get_tuner_state": "tuners.state",
    "Selection": "tuners.bias.selection",
    "resolve": "tuners.bias.selection",
    "TrainableSummary": "tuners.summary",
    "ALL_ROLES": "tuners.roles",
    "PAPER_ROLES": "tuners.roles",
    "PRESETS": "tuners.roles",
    "SelectionError": "tuners.errors",
    "UserError": "utils.errors",
    "BitFitTrainer": "hub.trainer",
    "HubError": "hub.errors",
    "download_adapter": "hub.client",
    "push_adapter_to_hub": "hub.client",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(f"bitfit_hf.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bitfit_hf' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # pragma: no cover
    from bitfit_hf.adapters.adapter import BitFitAdapter, load_adapter, save_adapter  # noqa: F401
    from bitfit_hf.adapters.auto import AutoBitFitModel  # noqa: F401
    from bitfit_hf.adapters.bank import AdapterBank  # noqa: F401
    from bitfit_hf.adapters.config import AdapterConfig, AdapterError, BaseModelMismatchError  # noqa: F401
    from bitfit_hf.adapters.export import export_merged  # noqa: F401
    from bitfit_hf.adapters.multitask import MultiTaskModel, MultiTaskOutput  # noqa: F401
    from bitfit_hf.adapters.peft_export import export_peft  # noqa: F401
    from bitfit_hf.hub.client import download_adapter, push_adapter_to_hub  # noqa: F401
    from bitfit_hf.hub.errors import HubError  # noqa: F401
    from bitfit_hf.hub.trainer import BitFitTrainer  # noqa: F401
    from bitfit_hf.tuners.bias.config import BitFitConfig  # noqa: F401
    from bitfit_hf.tuners.bias.model import BitFitState, apply_bitfit  # noqa: F401
    from bitfit_hf.tuners.bias.selection import Selection, resolve  # noqa: F401
    from bitfit_hf.tuners.bitfit_lora.config import BitFitLoraConfig  # noqa: F401
    from bitfit_hf.tuners.errors import SelectionError  # noqa: F401
    from bitfit_hf.tuners.roles import ALL_ROLES, PAPER_ROLES, PRESETS  # noqa: F401
    from bitfit_hf.tuners.state import get_bitfit_state, get_tuner_state  # noqa: F401
    from bitfit_hf.tuners.summary import TrainableSummary  # noqa: F401
    from bitfit_hf.utils.errors import UserError  # noqa: F401
