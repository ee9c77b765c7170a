"""Reading an adapter never changes the user's files: a side ``adapter_config.json`` that disagrees with the config
embedded in the weights (an interrupted save, a hand edit) or cannot be read is left as it is, the embedded one is
used, and the warning says so and how to repair the folder. A read-only folder loads."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest
from reliability_support import make_adapter, same_tensors

from bitfit_hf import AdapterBank, BitFitAdapter, load_adapter
from bitfit_hf.utils.constants import CONFIG_NAME
from bitfit_hf.utils.io import write_text_atomic


def snapshot(folder):
    """Every file's bytes and modification time (ns), and the folder's own mtime."""
    found = {".": os.stat(folder).st_mtime_ns}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        with open(path, "rb") as handle:
            found[name] = (handle.read(), os.stat(path).st_mtime_ns)
    return found


def stale(adapter_dir):
    embedded = json.loads((adapter_dir / CONFIG_NAME).read_text())
    newer = dict(embedded, metadata={"run": "a newer save, interrupted"})
    write_text_atomic(str(adapter_dir / CONFIG_NAME), json.dumps(newer))
    return embedded


@pytest.mark.parametrize("damage", ["stale", "broken"])
def test_a_load_leaves_the_folder_byte_for_byte_as_it_was(tmp_path, caplog, damage):
    base_dir, adapter_dir, tensors = make_adapter(tmp_path)
    if damage == "stale":
        embedded = stale(adapter_dir)
    else:
        embedded = json.loads((adapter_dir / CONFIG_NAME).read_text())
        (adapter_dir / CONFIG_NAME).write_text('{"half": ')
    before = snapshot(adapter_dir)
    with caplog.at_level(logging.WARNING, logger="bitfit_hf"):
        loaded = BitFitAdapter.from_pretrained(str(adapter_dir))
    assert same_tensors(loaded.tensors, tensors) and loaded.config.metadata == embedded["metadata"]
    assert snapshot(adapter_dir) == before
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "using the config embedded in" in warning and "left unchanged" in warning
    assert "save_pretrained" in warning  # how to repair it, explicitly


def test_a_read_only_folder_loads_and_is_not_touched(tmp_path):
    from conftest import tiny_model  # noqa: F401 - the tests' shared fixtures module

    base_dir, adapter_dir, tensors = make_adapter(tmp_path)
    stale(adapter_dir)
    before = snapshot(adapter_dir)
    for name in os.listdir(adapter_dir):
        os.chmod(adapter_dir / name, stat.S_IRUSR | stat.S_IRGRP)
    os.chmod(adapter_dir, stat.S_IRUSR | stat.S_IXUSR)
    try:
        import transformers as T

        model = T.BertForSequenceClassification.from_pretrained(str(base_dir)).eval()
        load_adapter(model, str(adapter_dir))
        bank = AdapterBank(T.BertForSequenceClassification.from_pretrained(str(base_dir)).eval())
        bank.add("task", str(adapter_dir))
        assert same_tensors(BitFitAdapter.from_pretrained(str(adapter_dir)).tensors, tensors)
    finally:
        os.chmod(adapter_dir, stat.S_IRWXU)
    assert snapshot(adapter_dir) == before
