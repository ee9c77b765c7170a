"""Pulling bias-only adapters onto stock models with the real huggingface_hub client.

Round trip on the real all-MiniLM-L6-v2 (BitFitTrainer steps -> push -> pull in a fresh process
onto a freshly loaded stock model -> identical logits); revision pinning by branch, tag and commit
with the resolved commit recorded; HF_HUB_OFFLINE=1 (and a stopped server) after a first download;
an adapter for another base refused; several pulled adapters switched with AdapterBank; clear errors
that leave nothing half-written; and the read side through olah, a third-party Hub mirror.
"""

from __future__ import annotations

import json
import os

import pytest
from hub_test_support import (  # noqa: F401 - fixtures are used by name
    DEFAULT_TOKEN,
    OTHER_TOKEN,
    assert_clean_error,
    assert_no_token_in_files,
    hf_home,
    hub_server,
    hub_server_factory,
    olah_available,
    other_base_dir,
    run,
    serve_with_olah,
    snippet,
    tiny_base_dir,
)

pytestmark = pytest.mark.hub


TRAIN_AND_PUSH_MINILM = """
import torch
from safetensors.torch import save_file
from transformers import AutoModelForSequenceClassification, TrainingArguments
from bitfit_hf import BitFitTrainer
from bitfit_hf.data.assets import minilm_path
torch.manual_seed(0)
model = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=2)
data = tokens_dataset(32, length=12, vocab=30000)
args = TrainingArguments(OUT, max_steps=3, per_device_train_batch_size=8, learning_rate=1e-2, report_to=[],
                         use_cpu=True, save_strategy="no", disable_tqdm=True, push_to_hub=True,
                         hub_model_id="tester/minilm-toy-bitfit")
trainer = BitFitTrainer(model, args, train_dataset=data)
trainer.train()
trainer.save_model()   # --push_to_hub: save_model pushes ("Model save")
inputs = {k: v % 30000 for k, v in batch().items()}
save_file({"logits": logits(model, inputs)}, EXPECTED)
result = trainer.state.global_step
"""

PULL_MINILM = """
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification
from bitfit_hf import AutoBitFitModel, load_adapter
from bitfit_hf.data.assets import minilm_path
expected = load_file(EXPECTED)
inputs = {k: v % 30000 for k, v in batch().items()}
auto = AutoBitFitModel.from_pretrained("tester/minilm-toy-bitfit", base_model=minilm_path())
stock = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=2)
untouched = logits(stock, inputs)
load_adapter(stock, "tester/minilm-toy-bitfit")
result = {
    "auto": bool(torch.equal(logits(auto, inputs), expected["logits"])),
    "load_adapter": bool(torch.equal(logits(stock, inputs), expected["logits"])),
    "stock_differs": not torch.equal(untouched, expected["logits"]),
}
"""


def test_round_trip_minilm_train_push_pull_identical_logits(hub_server, tmp_path, minilm_dir):
    expected = str(tmp_path / "expected.safetensors")
    steps = run(snippet(TRAIN_AND_PUSH_MINILM, OUT=str(tmp_path / "run"), EXPECTED=expected), hub_server,
                tmp_path / "trainer-home", timeout=600).value
    assert steps == 3
    files = hub_server.files("tester/minilm-toy-bitfit")
    assert hub_server.commits("tester/minilm-toy-bitfit")[0].title == "Model save"
    config = json.loads(files["adapter_config.json"])
    # the registry-installed MiniLM is recorded under its Hub id, so the repo works anywhere
    assert config["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert len(files["adapter_model.safetensors"]) < 200_000, "a bias-only adapter is a few hundred KB at most"
    readme = files["README.md"].decode()
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in readme and "![Bias change" in readme
    change = json.loads(files["bias_change.json"])
    assert change["layers"] == [str(i) for i in range(6)] and set(change["roles"]) == {
        "b_q", "b_k", "b_v", "b_m1", "b_LN1", "b_m2", "b_m3", "b_LN2"}
    out = run(snippet(PULL_MINILM, EXPECTED=expected), hub_server, tmp_path / "fresh-home", timeout=600).value
    assert out == {"auto": True, "load_adapter": True, "stock_differs": True}
    assert_no_token_in_files(tmp_path)


PUSH_VERSIONS = """
from huggingface_hub import HfApi
from bitfit_hf import BitFitAdapter
api = HfApi()
refs = {}
for seed, revision in ((1, None), (2, None), (3, "dev")):
    model = fake_trained(BASE, seed=seed)
    info = BitFitAdapter.from_model(model, BASE).push_to_hub("tester/pinned", revision=revision,
                                                               commit_message=f"seed {seed}")
    refs[seed] = {"commit": info.oid, "logits": logits(model).tolist()}
    if seed == 1:
        api.create_tag("tester/pinned", tag="v1", revision=info.oid)
result = refs
"""

PULL_VERSIONS = """
import torch
from bitfit_hf import BitFitAdapter, AutoBitFitModel
from bitfit_hf.hub.client import download_adapter
out = {}
for name, revision in (("default", None), ("tag", "v1"), ("commit", SHA2), ("branch", "dev")):
    adapter = BitFitAdapter.from_pretrained("tester/pinned", **({"revision": revision} if revision else {}))
    model = AutoBitFitModel.from_pretrained(adapter, base_model=BASE)
    out[name] = {"commit": adapter.config.metadata["resolved_commit"], "repo": adapter.config.metadata["resolved_repo"],
                 "logits": logits(model).tolist()}
out["never"] = catch(download_adapter, "tester/pinned", revision=NEVER)
out["never_tag"] = catch(download_adapter, "tester/pinned", revision="v0")
result = out
"""


def test_revision_pinning_and_offline_after_first_download(hub_server, hf_home, tmp_path, tiny_base_dir):
    pushed = run(snippet(PUSH_VERSIONS, BASE=tiny_base_dir), hub_server, tmp_path / "pusher-home").value
    pushed = {int(k): v for k, v in pushed.items()}
    initial = hub_server.commits("tester/pinned")[-1].oid
    assert hub_server.refs("tester/pinned")["tags"] == {"v1": pushed[1]["commit"]}
    variables = dict(BASE=tiny_base_dir, SHA2=pushed[2]["commit"], NEVER=initial)

    online = run(snippet(PULL_VERSIONS, **variables), hub_server, hf_home).value
    expect = {"default": 2, "tag": 1, "commit": 2, "branch": 3}
    for name, seed in expect.items():
        assert online[name]["commit"] == pushed[seed]["commit"], name
        assert online[name]["repo"] == "tester/pinned"
        assert online[name]["logits"] == pushed[seed]["logits"], name
    # the initial commit holds no adapter: a clear error, not a traceback
    assert_clean_error(online["never"], kind="HubAdapterNotFoundError", words=["adapter_model.safetensors"])
    assert_clean_error(online["never_tag"], kind="HubRevisionNotFoundError", words=["'v0'", "dev", "v1"])

    # HF_HUB_OFFLINE=1 with the same cache: every revision pulled before resolves from the cache
    offline = run(snippet(PULL_VERSIONS, **variables), hub_server, hf_home, offline=True).value
    for name in expect:
        assert offline[name] == online[name], name
    assert_clean_error(offline["never"], kind="HubOfflineError", words=["HF_HUB_OFFLINE", "cache"])

    # the server goes away without offline mode: cached revisions still load, with no traceback
    hub_server.stop()
    down = run(snippet(PULL_VERSIONS.replace('out["never"] = catch(download_adapter, "tester/pinned", revision=NEVER)\n', "")
                       .replace('out["never_tag"] = catch(download_adapter, "tester/pinned", revision="v0")\n', ""),
                       **variables), hub_server, hf_home).value
    for name in expect:
        assert down[name] == online[name], name
    assert_no_token_in_files(hf_home)


WRONG_BASE = """
from bitfit_hf import AutoBitFitModel, BitFitAdapter, load_adapter
BitFitAdapter.from_model(fake_trained(BASE, seed=1), BASE).push_to_hub("tester/for-base-a")
result = {
    "load_adapter": catch(load_adapter, load_base(OTHER), "tester/for-base-a"),
    "auto": catch(AutoBitFitModel.from_pretrained, "tester/for-base-a", base_model=OTHER),
    "right": AutoBitFitModel.from_pretrained("tester/for-base-a", base_model=BASE) is not None,
}
"""


def test_adapter_for_another_base_is_refused(hub_server, hf_home, tiny_base_dir, other_base_dir):
    out = run(snippet(WRONG_BASE, BASE=tiny_base_dir, OTHER=other_base_dir), hub_server, hf_home).value
    for key in ("load_adapter", "auto"):
        err = out[key]
        assert err is not None and "BaseModelMismatchError" in err["mro"], err
        assert "fingerprint" in err["message"] and "trained on base" in err["message"]
    assert out["right"] is True


BANK = """
from bitfit_hf import AdapterBank, BitFitAdapter
two = fake_trained(BASE, seed=5, num_labels=2)
three = fake_trained(BASE, seed=6, num_labels=3)
BitFitAdapter.from_model(two, BASE).push_to_hub("tester/task-two")
BitFitAdapter.from_model(three, BASE).push_to_hub("bitfit-org/task-three")
expected = {"two": logits(two).tolist(), "three": logits(three).tolist()}

# a fresh stock model: pull both, switch back and forth
model = load_base(BASE)
stock = logits(model).tolist()
bank = AdapterBank(model)
bank.add("two", "tester/task-two")
bank.add("three", "bitfit-org/task-three", revision="main")
seen = {}
for name in ("two", "three", "two", "three"):
    bank.activate(name)
    seen.setdefault(name, []).append(logits(model).tolist() == expected[name])
bank.restore_base()
result = {"seen": seen, "restored": logits(model).tolist() == stock, "labels": model.config.num_labels,
          "commits": {n: a.config.metadata["resolved_commit"] for n, a in bank.adapters.items()}}
"""


def test_adapter_bank_switches_pulled_adapters(hub_server, hf_home, tiny_base_dir):
    out = run(snippet(BANK, BASE=tiny_base_dir), hub_server, hf_home).value
    assert out["seen"] == {"two": [True, True], "three": [True, True]}
    assert out["restored"] is True
    assert out["commits"] == {"two": hub_server.head("tester/task-two"),
                              "three": hub_server.head("bitfit-org/task-three")}


PULL_ERRORS = """
import os
from bitfit_hf import BitFitAdapter
from bitfit_hf.hub.client import download_adapter
BitFitAdapter.from_model(fake_trained(BASE, seed=1), BASE).push_to_hub("tester/ok", token=TOKEN)
BitFitAdapter.from_model(fake_trained(BASE, seed=1), BASE).push_to_hub("tester/secret", token=TOKEN, private=True)
local = os.path.join(WORK, "adapter-out")
result = {
    "missing": catch(download_adapter, "tester/no-such-adapter", local_dir=local),
    "bad_revision": catch(download_adapter, "tester/ok", revision="no-such-branch", local_dir=local),
    "not_adapter": catch(download_adapter, "tester/plain-model"),
    "private_anonymous": catch(download_adapter, "tester/secret", token=False),
    "private_other_user": catch(download_adapter, "tester/secret", token=OTHER),
    "invalid_token": catch(download_adapter, "tester/ok", token="hf_definitely_not_valid"),
    "bad_path": catch(BitFitAdapter.from_pretrained, "./no/such/adapter-dir"),
    "bad_id": catch(BitFitAdapter.from_pretrained, "tester/two words"),
    "local_dir_exists": os.path.exists(local),
    "private_owner_ok": download_adapter("tester/secret", token=TOKEN)[1],
}
"""

GATED = """
from bitfit_hf import AutoBitFitModel
result = catch(AutoBitFitModel.from_pretrained, "tester/gated", token=OTHER, base_model=BASE)
"""

DOWN = """
from bitfit_hf.hub.client import download_adapter
result = catch(download_adapter, "tester/ok", local_dir=LOCAL)
"""


def test_pull_errors_are_clear_and_leave_nothing_half_written(hub_server, hf_home, tmp_path, tiny_base_dir):
    hub_server.create_repo("tester/plain-model", files={"config.json": b"{}", "model.safetensors": b"\x00" * 64})
    out = run(snippet(PULL_ERRORS, BASE=tiny_base_dir, TOKEN=DEFAULT_TOKEN, OTHER=OTHER_TOKEN, WORK=str(tmp_path)),
              hub_server, hf_home, token=None).value
    assert_clean_error(out["missing"], kind="HubRepoNotFoundError", words=["tester/no-such-adapter", "token"])
    assert_clean_error(out["bad_revision"], kind="HubRevisionNotFoundError", words=["no-such-branch", "main"])
    assert_clean_error(out["not_adapter"], kind="HubAdapterNotFoundError", words=["not a BitFit adapter"])
    assert_clean_error(out["private_anonymous"], kind="HubRepoNotFoundError", words=["private"])
    assert_clean_error(out["private_other_user"], kind="HubRepoNotFoundError", words=["private"])
    assert_clean_error(out["invalid_token"], kind="HubAuthError", words=["401"])
    assert_clean_error(out["bad_path"], kind="AdapterError", words=["no adapter directory"])
    assert_clean_error(out["bad_id"], kind="HubError", words=["neither a local adapter directory"])
    assert out["local_dir_exists"] is False, "a failed pull created the output directory"
    assert out["private_owner_ok"] == hub_server.head("tester/secret")

    # a gated repo the user was not granted access to
    weights = hub_server.files("tester/ok")["adapter_model.safetensors"]
    hub_server.create_repo("tester/gated", files={"adapter_model.safetensors": weights})
    hub_server.set_gated("tester/gated")
    gated = run(snippet(GATED, OTHER=OTHER_TOKEN, BASE=tiny_base_dir), hub_server, hf_home, token=None).value
    assert_clean_error(gated, kind="HubAuthError", words=["gated", "access"])

    # the server is down and nothing is cached: a clear connection error, no output folder
    url = hub_server.url
    hub_server.stop()
    down = run(snippet(DOWN, LOCAL=str(tmp_path / "x")), url, tmp_path / "empty-home").value
    assert_clean_error(down, kind="HubConnectionError", words=["cannot reach", "HF_HUB_OFFLINE"])
    assert not (tmp_path / "x").exists()

    # nothing half-written in the cache: no partial blobs, no snapshot without its weights file
    for home in (hf_home, tmp_path / "empty-home"):
        for folder, _dirs, names in os.walk(home):
            assert not [n for n in names if n.endswith(".incomplete")], folder
            if os.path.basename(os.path.dirname(folder)) == "snapshots" and names:
                assert "adapter_model.safetensors" in names, (folder, names)
    assert_no_token_in_files(hf_home, tmp_path)


OLAH_FILES = """
from bitfit_hf import BitFitAdapter
from bitfit_hf.reporting.model_card import write_model_card_files
out = {}
for seed, folder in ((1, V1), (2, V2)):
    model = fake_trained(BASE, seed=seed)
    adapter = BitFitAdapter.from_model(model, BASE)
    adapter.save_pretrained(folder)
    write_model_card_files(folder, adapter, "tester/olah-adapter")
    out[seed] = logits(model).tolist()
result = out
"""

OLAH_PULL = """
from bitfit_hf import AutoBitFitModel, BitFitAdapter
from bitfit_hf.hub.client import download_adapter
out = {}
for name, revision in (("main", None), ("tag", "v1"), ("branch", "dev"), ("commit", DEV_SHA)):
    adapter = BitFitAdapter.from_pretrained("tester/olah-adapter", **({"revision": revision} if revision else {}))
    model = AutoBitFitModel.from_pretrained(adapter, base_model=BASE)
    out[name] = {"commit": adapter.config.metadata["resolved_commit"], "logits": logits(model).tolist()}
out["missing"] = catch(download_adapter, "tester/not-mirrored")
result = out
"""


def test_pull_through_olah_mirror(tmp_path, tiny_base_dir, hub_server):
    ok, reason = olah_available()
    if not ok:
        pytest.skip(reason)
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    expected = run(snippet(OLAH_FILES, BASE=tiny_base_dir, V1=str(v1), V2=str(v2)), hub_server,
                   tmp_path / "build-home").value
    main_files = {p.name: p.read_bytes() for p in v1.iterdir() if p.name != "trainable_summary.json"}
    dev_files = {p.name: p.read_bytes() for p in v2.iterdir() if p.name != "trainable_summary.json"}
    with serve_with_olah(main_files, "tester/olah-adapter", branches={"dev": dev_files}, tags=["v1"],
                         lfs_suffixes=(".safetensors", ".png")) as endpoint:
        refs = endpoint.refs
        home = tmp_path / "olah-home"
        out = run(snippet(OLAH_PULL, BASE=tiny_base_dir, DEV_SHA=refs["dev"]), endpoint, home, token=None).value
        offline = run(snippet(OLAH_PULL.replace('out["missing"] = catch(download_adapter, "tester/not-mirrored")\n', ""),
                              BASE=tiny_base_dir, DEV_SHA=refs["dev"]), endpoint, home, token=None, offline=True).value
    expect = {"main": ("main", "1"), "tag": ("v1", "1"), "branch": ("dev", "2"), "commit": ("dev", "2")}
    for name, (ref, seed) in expect.items():
        assert out[name]["commit"] == refs[ref], name
        assert out[name]["logits"] == expected[seed], name
        assert offline[name] == out[name], name
    assert_clean_error(out["missing"], kind="HubRepoNotFoundError", words=["tester/not-mirrored"])


INTERRUPTED = """
import os
from bitfit_hf.hub.client import download_adapter
import time
start = time.time()
result = {"error": catch(download_adapter, "tester/cut", local_dir=LOCAL), "local_dir": os.path.exists(LOCAL),
          "seconds": time.time() - start}
"""


def test_interrupted_download_leaves_nothing_half_written(hub_server, hf_home, tmp_path, tiny_base_dir):
    from hub_test_support import CuttingProxy

    run(snippet("from bitfit_hf import BitFitAdapter\n"
                "BitFitAdapter.from_model(fake_trained(BASE, seed=1), BASE).push_to_hub('tester/cut')",
                BASE=tiny_base_dir), hub_server, tmp_path / "pusher-home")
    proxy = CuttingProxy(hub_server.url)
    try:
        local = str(tmp_path / "adapter-out")
        out = run(snippet(INTERRUPTED, LOCAL=local), proxy.url, hf_home).value
    finally:
        proxy.stop()
    assert proxy.cut_requests >= 2, "the download was not cut and resumed"
    assert_clean_error(out["error"], kind="HubConnectionError", words=["tester/cut"])
    assert out["local_dir"] is False
    leftovers = [os.path.join(f, n) for f, _d, names in os.walk(hf_home) for n in names
                 if n.endswith(".incomplete") or n == "adapter_model.safetensors"]
    assert leftovers == [], leftovers
    # the same cache then downloads the adapter cleanly
    commit = run("from bitfit_hf.hub.client import download_adapter\nresult = download_adapter('tester/cut')[1]",
                 hub_server, hf_home).value
    assert commit == hub_server.head("tester/cut")
