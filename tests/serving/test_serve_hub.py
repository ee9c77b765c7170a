"""`bitfit-hf serve` with adapters given as Hub ids pinned to revisions, against the project's test Hub
(the real huggingface_hub client in the server process; nothing leaves 127.0.0.1)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from serve_support import adapters, call, predict  # noqa: F401 - fixtures
from tiny import alone, reference_scores, tiny_tokenizer

try:
    from tests.support.hub_server import client_env, hf_home, hub_server, hub_server_factory, run_client  # noqa: F401
    from tests.support.serve_process import wait_for_listening_url
except ImportError:  # tests/ (not the repo root) on sys.path
    from support.hub_server import client_env, hf_home, hub_server, hub_server_factory, run_client  # type: ignore[no-redef]  # noqa: F401
    from support.serve_process import wait_for_listening_url  # type: ignore[no-redef]

pytestmark = pytest.mark.hub

PUSH = """
from huggingface_hub import HfApi
api = HfApi()
api.create_repo("tester/served")
main = api.upload_folder(repo_id="tester/served", folder_path=FIRST, commit_message="first task")
api.create_branch("tester/served", branch="v2")
api.upload_folder(repo_id="tester/served", folder_path=SECOND, revision="v2", commit_message="second task")
result = main.oid
"""


def test_serves_hub_adapters_at_their_revisions(adapters, hub_server, hf_home):  # noqa: F811
    env = client_env(hub_server, hf_home=hf_home, extra={"OMP_NUM_THREADS": "1"})
    code = "".join(f"{k} = {v!r}\n" for k, v in {"FIRST": adapters["c0"], "SECOND": adapters["c1"]}.items()) + PUSH
    pushed = run_client(code, env=env, timeout=300)
    main_commit = pushed.unwrap()
    exe = [sys.executable, "-m", "bitfit_hf.cli", "serve", "first=tester/served", "second=tester/served@v2",
           "--base-model", adapters["base"], "--port", "0"]
    proc = subprocess.Popen(exe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url, _ = wait_for_listening_url(proc, timeout=300)
        assert url, proc.stderr.read()[-3000:] if proc.poll() is not None else "no address"
        tok = tiny_tokenizer()
        for name, folder in (("first", adapters["c0"]), ("second", adapters["c1"])):
            status, _, body = predict(url, {"inputs": "the cat sat", "adapter": name})
            assert status == 200
            want = reference_scores(alone(folder), tok, "the cat sat")
            assert {g["label"]: g["score"] for g in body} == pytest.approx(want, abs=1e-5)
        listed = {a["name"]: a for a in call(url, "GET", "/adapters")[2]}
        assert listed["first"]["source"] == "tester/served" and listed["first"]["revision"] is None
        assert listed["first"]["commit"] == main_commit
        assert listed["second"]["revision"] == "v2" and listed["second"]["commit"] not in (None, main_commit)
    finally:
        proc.terminate()
        proc.wait(60)
