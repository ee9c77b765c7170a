"""An (IA)³ adapter on the project's test Hub: pushed with its card and a PEFT copy in one commit, pulled back by
``AutoBitFitModel`` with the trained logits exactly, and its ``peft/`` copy loaded by plain ``peft`` from the repo
with the same logits. The card names the method, its paper and the vectors."""

from __future__ import annotations

import json

import pytest
import yaml
from hub_test_support import (  # noqa: F401 - fixtures are used by name
    hf_home,
    hub_server,
    hub_server_factory,
    run,
    snippet,
    tiny_base_dir,
)

pytestmark = pytest.mark.hub

PUSH_PULL = """
import peft, torch
from bitfit_hf import AutoBitFitModel, BitFitAdapter
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.bitfit_ia3 import IA3Config
model = load_base(BASE)
apply_method(model, IA3Config())
g = torch.Generator().manual_seed(5)
with torch.no_grad():
    for p in model.parameters():
        if p.requires_grad:
            p.add_(0.2 * torch.randn(p.shape, generator=g))
model.eval()
expected = logits(model)
info = BitFitAdapter.from_model(model, BASE).push_to_hub(REPO, peft=True, eval_results={"eval_accuracy": 0.5})
pulled = AutoBitFitModel.from_pretrained(REPO).eval()
plain = peft.PeftModel.from_pretrained(load_base(BASE), REPO, subfolder="peft").eval()
result = {"oid": info.oid, "pulled": torch.equal(logits(pulled), expected),
          "peft": (logits(plain) - expected).abs().max().item()}
"""


def test_ia3_adapter_push_pull_and_peft_copy(hub_server, hf_home, tmp_path, tiny_base_dir):
    repo = "tester/tiny-ia3"
    out = run(snippet(PUSH_PULL, BASE=tiny_base_dir, REPO=repo), hub_server, hf_home, extra={"TMPDIR": str(tmp_path)}).value
    assert out["pulled"] is True and out["peft"] <= 1e-6
    commits = hub_server.commits(repo)
    assert [c.title for c in commits] == ["Upload BitFit adapter", "initial commit"] and out["oid"] == commits[0].oid
    files = hub_server.files(repo)
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md", "peft/adapter_config.json",
            "peft/adapter_model.safetensors"} <= set(files)
    assert json.loads(files["adapter_config.json"])["method"] == "ia3"
    assert json.loads(files["peft/adapter_config.json"])["peft_type"] == "IA3"
    readme = files["README.md"].decode()
    meta = yaml.safe_load(readme.split("---\n", 2)[1])
    assert meta["library_name"] == "bitfit-hf" and "ia3" in meta["tags"]
    assert "(IA)³" in readme and "arxiv.org/abs/2205.05638" in readme and "liu2022fewshot" in readme
    assert "(IA)³ scaling vectors" in readme  # the role row of the summary table
    assert 'subfolder="peft"' in readme and "PEFT's BEFT" not in readme
