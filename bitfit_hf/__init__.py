"""bitfit-hf: BitFit (bias-only fine-tuning, Ben Zaken et al., ACL 2022) for the Hugging Face stack."""

__version__ = "0.1.0"

from .adapter import BitFitAdapter, load_adapter, save_adapter  # noqa: E402
from .adapter_config import AdapterConfig, AdapterError, BaseModelMismatchError  # noqa: E402
from .auto import AutoBitFitModel  # noqa: E402
from .bank import AdapterBank  # noqa: E402
from .config import BitFitConfig  # noqa: E402
from .export import export_merged  # noqa: E402
from .model import BitFitState, apply_bitfit, get_bitfit_state  # noqa: E402
from .roles import ALL_ROLES, PAPER_ROLES, PRESETS  # noqa: E402
from .selection import Selection, resolve  # noqa: E402
from .summary import TrainableSummary  # noqa: E402
from .trainer import BitFitTrainer  # noqa: E402

__all__ = [
    "ALL_ROLES",
    "PAPER_ROLES",
    "PRESETS",
    "AdapterBank",
    "AdapterConfig",
    "AdapterError",
    "AutoBitFitModel",
    "BaseModelMismatchError",
    "BitFitAdapter",
    "BitFitConfig",
    "BitFitState",
    "BitFitTrainer",
    "Selection",
    "TrainableSummary",
    "apply_bitfit",
    "export_merged",
    "get_bitfit_state",
    "load_adapter",
    "resolve",
    "save_adapter",
]
