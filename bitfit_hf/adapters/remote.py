"""Where adapters and base checkpoints that are not local folders come from, and where pushes go.

The adapter layer sits below the Hub client, so it never imports it. The package root plugs a remote
store in by module name (``bitfit_hf.hub.client``), imported only when a Hub id is first used, so
local loading never pays for (or depends on) the Hub code. The store provides
``download_adapter(repo_id, **kwargs) -> (directory, commit)``,
``push_adapter_to_hub(adapter, repo_id, **kwargs)`` and
``checkpoint_files(repo_id, revision, token, local_files_only) -> [path, ...]``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

_store_module: Optional[str] = None


def set_remote_store(module_name: Optional[str]) -> None:
    """Name the module that serves Hub ids (``None`` turns remote access off)."""
    global _store_module
    _store_module = module_name


def remote_store() -> ModuleType:
    """The remote store's module; a clear error when none is plugged in."""
    if _store_module is None:
        raise RuntimeError("No Hub client is plugged in: import bitfit_hf (its root wires bitfit_hf.hub.client) "
                           "or pass a local folder.")
    return importlib.import_module(_store_module)
