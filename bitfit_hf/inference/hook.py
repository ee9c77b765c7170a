"""Run a function right after a module is first imported, without importing it now.

``import bitfit_hf`` must stay cheap (``bitfit-hf --help`` loads no torch), yet registering the
question-answering pipeline needs ``transformers.pipelines``, which imports torch. So the package root asks
for the registration to happen when ``transformers.pipelines`` is imported by anyone (at once when it
already is). Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import threading
from typing import Callable

logger = logging.getLogger(__name__)


def _run(name: str, callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception as err:  # noqa: BLE001 - a failed registration must never break the user's import
        logger.warning("bitfit-hf: could not run the hook on importing %s: %s", name, err)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first import of ``name`` it lets the other finders find the module and
    wraps the loader so ``callback`` runs once the module has executed."""

    def __init__(self, name: str, callback: Callable[[], None]):
        self.name, self.callback = name, callback
        self.lock = threading.Lock()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        with self.lock:
            if self not in sys.meta_path:
                return None
            sys.meta_path.remove(self)  # one shot; and the lookup below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback, name = spec.loader, self.callback, self.name
        exec_module = loader.exec_module

        def exec_then_call(module):
            exec_module(module)
            _run(name, callback)

        loader.exec_module = exec_then_call  # this spec's own loader instance
        return spec


def after_import(name: str, callback: Callable[[], None]) -> None:
    """``callback()`` once ``name`` has been imported: now if it already is, else right after its import."""
    if name in sys.modules:
        _run(name, callback)
        return
    if not any(isinstance(f, _AfterImport) and f.name == name and f.callback is callback for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
