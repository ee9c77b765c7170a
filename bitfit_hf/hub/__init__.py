"""The only code that talks to the Hub: pull (``download_adapter``), push (``push_adapter_to_hub``), the
trainer's Hub mixin, and the :class:`HubError` family with fix-it messages (docs/hub.md)."""

from bitfit_hf.hub.client import create_adapter_repo, download_adapter, push_adapter_folder, push_adapter_to_hub
from bitfit_hf.hub.errors import (
    HubAdapterNotFoundError,
    HubAuthError,
    HubConflictError,
    HubConnectionError,
    HubError,
    HubOfflineError,
    HubRepoNotFoundError,
    HubRevisionNotFoundError,
)

__all__ = [
    "HubAdapterNotFoundError", "HubAuthError", "HubConflictError", "HubConnectionError", "HubError", "HubOfflineError",
    "HubRepoNotFoundError", "HubRevisionNotFoundError", "create_adapter_repo", "download_adapter", "push_adapter_folder",
    "push_adapter_to_hub",
]
