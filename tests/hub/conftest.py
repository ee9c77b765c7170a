"""The hub tests' fixtures, found by pytest here (a test module names them as arguments, never imports them):
the test Hub server and client home from ``tests/support/hub_server.py``, and two tiny stock bases."""

from __future__ import annotations

import pytest
from hub_test_support import hub_support

hf_home, hub_server, hub_server_factory = hub_support.hf_home, hub_support.hub_server, hub_support.hub_server_factory


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory) -> str:
    """One stock tiny BERT base shared by the hub tests (saved once, read by every client)."""
    import hub_client_lib

    return hub_client_lib.make_base(str(tmp_path_factory.mktemp("tiny-base") / "base"), seed=0)


@pytest.fixture(scope="session")
def other_base_dir(tmp_path_factory) -> str:
    """Same architecture, other weights: adapters trained on ``tiny_base_dir`` must be refused here."""
    import hub_client_lib

    return hub_client_lib.make_base(str(tmp_path_factory.mktemp("other-base") / "base"), seed=123)
