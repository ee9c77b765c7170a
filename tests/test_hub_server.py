"""The test Hub (tests/support/hub_server.py) driven by the REAL ``huggingface_hub`` client.

Every client scenario runs in a fresh subprocess whose environment points ``HF_ENDPOINT``
at the in-process test server (see the module docstring of ``tests.support.hub_server``);
only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

try:
    from tests.support import hub_server as hub_support
    from tests.support import olah_server as olah_support
except ImportError:  # pytest run with tests/ (not the repo root) on sys.path
    from support import hub_server as hub_support  # type: ignore[no-redef]
    from support import olah_server as olah_support  # type: ignore[no-redef]

# each name bound once, whichever spelling imported the support modules (the fixtures are used by name)
DEFAULT_GITATTRIBUTES = hub_support.DEFAULT_GITATTRIBUTES
DEFAULT_TOKEN, OTHER_TOKEN = hub_support.DEFAULT_TOKEN, hub_support.OTHER_TOKEN
client_env, run_client = hub_support.client_env, hub_support.run_client
hf_home, hub_client, hub_server, hub_server_factory = (
    hub_support.hf_home, hub_support.hub_client, hub_support.hub_server, hub_support.hub_server_factory)
olah_available, serve_with_olah = olah_support.olah_available, olah_support.serve_with_olah

pytestmark = pytest.mark.hub


def snippet(code: str, **variables: object) -> str:
    """Prefix ``code`` with ``NAME = repr(value)`` lines (keeps braces out of f-strings)."""
    return "".join(f"{name} = {value!r}\n" for name, value in variables.items()) + code


ERRORS_HELPER = """
def catch(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:
        resp = getattr(e, "response", None)
        return {"mro": [c.__name__ for c in type(e).__mro__], "status": getattr(resp, "status_code", None),
                "message": str(e)}
    return None
"""


def adapter_folder(root: Path, *, weights_size: int = 3000, seed: bytes = b"a") -> dict[str, bytes]:
    """A small BitFit-adapter-like folder; returns {path: bytes}."""
    files = {
        "adapter_config.json": json.dumps({"base_model": "tiny", "bias_only": True}).encode(),
        "adapter_model.safetensors": hashlib.sha256(seed).digest() * (weights_size // 32) + b"x" * (weights_size % 32),
        "README.md": b"---\nlicense: apache-2.0\ntags:\n- bitfit\nlibrary_name: bitfit-hf\n---\n# Adapter\n",
        "logs/train.txt": b"step 1 loss 0.5\n",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def http(method: str, url: str, *, data: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - 127.0.0.1 only
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


# ---------------------------------------------------------------------------- repos


def test_create_repo_exist_ok_and_duplicate_409(hub_server, hub_client):
    code = ERRORS_HELPER + """
from huggingface_hub import HfApi
api = HfApi()
url = api.create_repo("tester/dup")
again = api.create_repo("tester/dup", exist_ok=True)
org = api.create_repo("bitfit-org/shared", private=True)
result = {"url": str(url), "repo_id": url.repo_id, "again": str(again), "org": org.repo_id,
          "dup": catch(api.create_repo, "tester/dup"), "whoami": api.whoami()["name"]}
"""
    out = hub_client(code).unwrap()
    assert out["url"] == f"{hub_server.url}/tester/dup"
    assert out["repo_id"] == "tester/dup" and out["again"] == out["url"]
    assert out["org"] == "bitfit-org/shared"
    assert out["whoami"] == "tester"
    assert out["dup"]["status"] == 409 and "HfHubHTTPError" in out["dup"]["mro"]
    # like the Hub, a new repo starts with an initial commit holding .gitattributes
    assert hub_server.files("tester/dup") == {".gitattributes": DEFAULT_GITATTRIBUTES}
    assert [c.title for c in hub_server.commits("tester/dup")] == ["initial commit"]
    assert all(len(c.oid) == 40 for c in hub_server.commits("tester/dup"))


# ---------------------------------------------------------------------------- uploads


def test_upload_folder_regular_path(hub_server, hub_client, tmp_path):
    files = adapter_folder(tmp_path / "adapter")
    code = snippet("""
from huggingface_hub import HfApi
api = HfApi()
api.create_repo("tester/regular")
info = api.upload_folder(repo_id="tester/regular", folder_path=FOLDER, commit_message="Add BitFit adapter",
                         commit_description="bias terms only")
result = {"oid": info.oid, "url": info.commit_url}
""", FOLDER=str(tmp_path / "adapter"))
    out = hub_client(code).unwrap()
    assert hub_server.head("tester/regular") == out["oid"]
    assert out["url"] == f"{hub_server.url}/tester/regular/commit/{out['oid']}"
    assert hub_server.files("tester/regular") == {".gitattributes": DEFAULT_GITATTRIBUTES, **files}
    assert hub_server.lfs_files("tester/regular") == set()
    last = hub_server.commits("tester/regular")[0]
    assert (last.title, last.message, last.author) == ("Add BitFit adapter", "bias terms only", "tester")
    # regular path: no LFS traffic at all, README validated
    assert not hub_server.requests_to("POST", ".git/info/lfs")
    assert not hub_server.requests_to("PUT")
    assert hub_server.requests_to("POST", "/api/validate-yaml")


def test_upload_folder_lfs_path(hub_server_factory, tmp_path):
    hub = hub_server_factory(lfs_suffixes=(".safetensors",), lfs_threshold=4096)
    files = adapter_folder(tmp_path / "adapter", weights_size=1500)
    big = os.urandom(6000)  # above lfs_threshold
    (tmp_path / "adapter" / "optimizer.pt").write_bytes(big)
    files["optimizer.pt"] = big
    home = tmp_path / "home"
    code = snippet("""
import hashlib
from huggingface_hub import HfApi, hf_hub_download
api = HfApi()
api.create_repo("tester/lfs")
info = api.upload_folder(repo_id="tester/lfs", folder_path=FOLDER)
meta = api.repo_info("tester/lfs", files_metadata=True)
paths = {p.path: p for p in api.list_repo_tree("tester/lfs", recursive=True) if hasattr(p, "blob_id")}
result = {
    "oid": info.oid,
    "siblings": {s.rfilename: (s.lfs.sha256 if s.lfs else None) for s in meta.siblings},
    "tree_lfs": {p: (f.lfs.sha256 if f.lfs else None) for p, f in paths.items()},
    "downloaded": {p: hashlib.sha256(open(hf_hub_download("tester/lfs", p), "rb").read()).hexdigest()
                   for p in ["adapter_model.safetensors", "optimizer.pt", "adapter_config.json"]},
}
""", FOLDER=str(tmp_path / "adapter"))
    out = run_client(code, env=client_env(hub, hf_home=home)).unwrap()
    assert hub.lfs_files("tester/lfs") == {"adapter_model.safetensors", "optimizer.pt"}
    assert hub.files("tester/lfs") == {".gitattributes": DEFAULT_GITATTRIBUTES, **files}
    sha = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    assert out["siblings"]["adapter_model.safetensors"] == sha["adapter_model.safetensors"]
    assert out["siblings"]["optimizer.pt"] == sha["optimizer.pt"]
    assert out["siblings"]["adapter_config.json"] is None
    assert out["tree_lfs"]["optimizer.pt"] == sha["optimizer.pt"] and out["tree_lfs"]["README.md"] is None
    assert out["downloaded"] == {p: sha[p] for p in out["downloaded"]}
    # the LFS protocol was really used: batch, one PUT per object, verify
    assert len(hub.requests_to("POST", "/tester/lfs.git/info/lfs/objects/batch")) == 1
    puts = hub.requests_to("PUT", "/__lfs/upload/")
    assert sorted(r.path.rsplit("/", 1)[1] for r in puts) == sorted([sha["adapter_model.safetensors"],
                                                                     sha["optimizer.pt"]])
    assert len(hub.requests_to("POST", "/__lfs/verify")) == 2


def test_identical_upload_makes_no_new_commit(hub_server_factory, tmp_path):
    hub = hub_server_factory(lfs_suffixes=(".safetensors",))
    adapter_folder(tmp_path / "adapter")
    home = tmp_path / "home"
    code = snippet("""
from huggingface_hub import HfApi
api = HfApi()
api.create_repo("tester/noop")
first = api.upload_folder(repo_id="tester/noop", folder_path=FOLDER)
second = api.upload_folder(repo_id="tester/noop", folder_path=FOLDER)
result = {"first": first.oid, "second": second.oid, "second_url": second.commit_url,
          "n_commits": len(api.list_repo_commits("tester/noop"))}
""", FOLDER=str(tmp_path / "adapter"))
    res = run_client(code, env=client_env(hub, hf_home=home))
    out = res.unwrap()
    # no-op: the client sends no commit and reports the current head of the branch
    assert out["second"] == out["first"] == hub.head("tester/noop")
    assert out["second_url"].endswith(f"/tester/noop/commit/{out['first']}")
    assert out["n_commits"] == 2  # initial commit + first upload
    assert len(hub.requests_to("POST", "/api/models/tester/noop/commit/")) == 1
    assert "No files have been modified since last commit" in res.stderr

    # changing one file makes exactly one new commit carrying only that file
    (tmp_path / "adapter" / "adapter_config.json").write_text('{"changed": true}')
    hub.clear_requests()
    out2 = run_client(snippet("""
from huggingface_hub import HfApi
result = HfApi().upload_folder(repo_id="tester/noop", folder_path=FOLDER).oid
""", FOLDER=str(tmp_path / "adapter")), env=client_env(hub, hf_home=home)).unwrap()
    assert out2 == hub.head("tester/noop") != out["first"]
    assert len(hub.commits("tester/noop")) == 3
    commit_req = hub.requests_to("POST", "/commit/")
    assert len(commit_req) == 1
    assert not hub.requests_to("PUT")  # the unchanged LFS file was not uploaded again


def test_commit_without_operations_still_creates_a_commit(hub_server):
    """The client never sends an empty change set; if one arrives, the Hub makes an (empty) commit."""
    before = hub_server.create_repo("tester/empty", files={"a.txt": b"a"})
    body = json.dumps({"key": "header", "value": {"summary": "empty", "description": ""}}).encode() + b"\n"
    status, _, payload = http("POST", f"{hub_server.url}/api/models/tester/empty/commit/main", data=body,
                              headers={"Authorization": f"Bearer {DEFAULT_TOKEN}",
                                       "Content-Type": "application/x-ndjson"})
    assert status == 200
    oid = json.loads(payload)["commitOid"]
    assert oid != before and hub_server.head("tester/empty") == oid
    assert hub_server.commits("tester/empty")[0].parent == before
    assert hub_server.files("tester/empty") == hub_server.files("tester/empty", before)


def test_delete_operations_pagination_and_create_pr(hub_server_factory, tmp_path):
    hub = hub_server_factory(tree_page_size=2, commits_page_size=1)
    hub.create_repo("tester/ops", files={f"dir/f{i}.txt": f"{i}" for i in range(5)} | {"keep.txt": "k",
                                                                                          "gone.txt": "g"})
    code = ERRORS_HELPER + """
from huggingface_hub import HfApi, CommitOperationAdd, CommitOperationDelete
api = HfApi()
listed = sorted(api.list_repo_files("tester/ops"))
n_commits = len(api.list_repo_commits("tester/ops"))
api.create_commit("tester/ops", operations=[CommitOperationDelete("gone.txt"), CommitOperationDelete("dir/", is_folder=True),
                  CommitOperationAdd("new.txt", b"n")], commit_message="prune")
missing = catch(api.delete_file, "nothere.txt", "tester/ops")
pr = api.create_commit("tester/ops", operations=[CommitOperationAdd("pr.txt", b"p")], commit_message="pr",
                       create_pr=True)
refs = api.list_repo_refs("tester/ops", include_pull_requests=True)
result = {"listed": listed, "n_commits": n_commits, "after": sorted(api.list_repo_files("tester/ops")),
          "missing": missing, "pr_url": pr.pr_url, "pr_num": pr.pr_num,
          "prs": [r.ref for r in refs.pull_requests]}
"""
    out = run_client(code, env=client_env(hub, hf_home=tmp_path / "home")).unwrap()
    assert out["listed"] == sorted([".gitattributes", "gone.txt", "keep.txt"] + [f"dir/f{i}.txt" for i in range(5)])
    assert out["n_commits"] == 2
    assert out["after"] == [".gitattributes", "keep.txt", "new.txt"]
    assert "EntryNotFoundError" in out["missing"]["mro"] and "doesn't exist" in out["missing"]["message"]
    assert out["pr_num"] == 1 and out["prs"] == ["refs/pr/1"]
    assert "pr.txt" in hub.files("tester/ops", "refs/pr/1") and "pr.txt" not in hub.files("tester/ops")
    # pagination really happened (Link: rel="next")
    assert any("cursor=" in r.query for r in hub.requests_to("GET", "/tree/"))
    assert any("p=1" in r.query for r in hub.requests_to("GET", "/commits/"))


def test_model_card_push_and_load(hub_server, hub_client):
    code = ERRORS_HELPER + """
from huggingface_hub import HfApi, ModelCard
HfApi().create_repo("tester/card")
card = ModelCard("---\\nlicense: mit\\ntags: [bitfit]\\n---\\n# BitFit adapter\\n")
card.push_to_hub("tester/card")
loaded = ModelCard.load("tester/card")
bad = catch(HfApi().upload_file, path_or_fileobj=b"---\\nlicense: [unclosed\\n---\\n", path_in_repo="README.md",
            repo_id="tester/card")
result = {"license": loaded.data.license, "text": loaded.text, "bad": bad}
"""
    out = hub_client(code).unwrap()
    assert out["license"] == "mit" and "BitFit adapter" in out["text"]
    assert out["bad"] is not None and "ValueError" in out["bad"]["mro"]
    assert hub_server.files("tester/card")["README.md"].startswith(b"---\nlicense: mit")


# ---------------------------------------------------------------------------- revisions and downloads


def test_branch_tag_and_downloads_at_revisions(hub_server, hub_client):
    code = """
from huggingface_hub import HfApi, hf_hub_download
api = HfApi()
repo = "tester/revs"
api.create_repo(repo)
c1 = api.upload_file(path_or_fileobj=b'{"v": 1}', path_in_repo="config.json", repo_id=repo)
api.create_branch(repo, branch="dev")
api.create_branch(repo, branch="dev", exist_ok=True)
c2 = api.upload_file(path_or_fileobj=b'{"v": 2}', path_in_repo="config.json", repo_id=repo, revision="dev",
                     commit_message="v2 on dev")
api.create_tag(repo, tag="v1.0", tag_message="first")
read = lambda rev: open(hf_hub_download(repo, "config.json", revision=rev)).read()
refs = api.list_repo_refs(repo)
result = {
    "c1": c1.oid, "c2": c2.oid,
    "main": read("main"), "dev": read("dev"), "tag": read("v1.0"), "sha1": read(c1.oid), "sha2": read(c2.oid),
    "branches": {b.name: b.target_commit for b in refs.branches},
    "tags": {t.name: t.target_commit for t in refs.tags},
    "dev_titles": [c.title for c in api.list_repo_commits(repo, revision="dev")],
    "main_titles": [c.title for c in api.list_repo_commits(repo)],
    "info_dev": api.repo_info(repo, revision="dev").sha,
    "info_sha": api.repo_info(repo, revision=c1.oid).sha,
}
api.delete_branch(repo, branch="dev")
result["after_delete"] = [b.name for b in api.list_repo_refs(repo).branches]
"""
    out = hub_client(code).unwrap()
    assert (out["main"], out["tag"], out["sha1"]) == ('{"v": 1}',) * 3
    assert (out["dev"], out["sha2"]) == ('{"v": 2}',) * 2
    assert out["branches"] == {"main": out["c1"], "dev": out["c2"]}
    assert out["tags"] == {"v1.0": out["c1"]}
    assert out["dev_titles"][0] == "v2 on dev" and out["dev_titles"][-1] == "initial commit"
    assert len(out["main_titles"]) == 2
    assert (out["info_dev"], out["info_sha"]) == (out["c2"], out["c1"])
    assert out["after_delete"] == ["main"]


def test_snapshot_download_repo_info_and_listing(hub_server, hub_client):
    files = {"adapter_config.json": b"{}", "adapter_model.safetensors": os.urandom(2048), "nested/a/b.txt": b"b"}
    sha = hub_server.create_repo("tester/snap", files=files, lfs=["adapter_model.safetensors"])
    code = """
import os
from huggingface_hub import HfApi, snapshot_download
api = HfApi()
folder = snapshot_download("tester/snap")
got = {}
for root, _, names in os.walk(folder):
    for n in names:
        p = os.path.join(root, n)
        got[os.path.relpath(p, folder).replace(os.sep, "/")] = open(p, "rb").read().hex()
info = api.repo_info("tester/snap")
result = {"folder": folder, "got": got, "sha": info.sha, "siblings": sorted(s.rfilename for s in info.siblings),
          "files": api.list_repo_files("tester/snap"), "exists": api.file_exists("tester/snap", "nested/a/b.txt"),
          "top": sorted(e.path for e in api.list_repo_tree("tester/snap")),
          "sub": sorted(e.path for e in api.list_repo_tree("tester/snap", path_in_repo="nested", recursive=True))}
"""
    out = hub_client(code).unwrap()
    expected = {".gitattributes": DEFAULT_GITATTRIBUTES, **files}
    assert out["got"] == {p: d.hex() for p, d in expected.items()}
    assert out["folder"].endswith(f"snapshots/{sha}") and out["sha"] == sha
    assert out["siblings"] == sorted(expected) == sorted(out["files"])
    assert out["exists"] is True
    assert out["top"] == [".gitattributes", "adapter_config.json", "adapter_model.safetensors", "nested"]
    assert out["sub"] == ["nested/a", "nested/a/b.txt"]


# ---------------------------------------------------------------------------- errors and auth


def test_missing_repo_revision_file_and_stale_parent(hub_server, hub_client):
    hub_server.create_repo("tester/err", files={"config.json": b"{}"})
    old = hub_server.head("tester/err")
    hub_server.commit_files("tester/err", {"other.txt": b"o"})
    code = ERRORS_HELPER + """
from huggingface_hub import HfApi, hf_hub_download, CommitOperationAdd
api = HfApi()
result = {
    "dl_repo": catch(hf_hub_download, "tester/nope", "config.json"),
    "info_repo": catch(api.repo_info, "tester/nope"),
    "dl_rev": catch(hf_hub_download, "tester/err", "config.json", revision="no-such-branch"),
    "info_rev": catch(api.repo_info, "tester/err", revision="no-such-branch"),
    "dl_file": catch(hf_hub_download, "tester/err", "missing.json"),
    "upload_rev": catch(api.upload_file, path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="tester/err",
                        revision="no-such-branch"),
    "stale": catch(api.create_commit, "tester/err", operations=[CommitOperationAdd("y.txt", b"y")],
                   commit_message="stale", parent_commit=OLD),
    "repo_exists": api.repo_exists("tester/nope"),
    "file_exists": api.file_exists("tester/err", "missing.json"),
    "revision_exists": api.revision_exists("tester/err", "no-such-branch"),
}
"""
    out = hub_client(snippet(code, OLD=old)).unwrap()
    for key in ("dl_repo", "info_repo"):
        assert "RepositoryNotFoundError" in out[key]["mro"], out[key]
    for key in ("dl_rev", "info_rev", "upload_rev"):
        assert "RevisionNotFoundError" in out[key]["mro"], out[key]
    assert "EntryNotFoundError" in out["dl_file"]["mro"] and out["dl_file"]["status"] == 404
    assert out["stale"]["status"] == 412 and "HfHubHTTPError" in out["stale"]["mro"]
    assert (out["repo_exists"], out["file_exists"], out["revision_exists"]) == (False, False, False)
    assert "y.txt" not in hub_server.files("tester/err")


def test_auth_401_403_private_and_gated(hub_server, hub_client):
    hub_server.create_repo("tester/pub", files={"config.json": b"{}"})
    hub_server.create_repo("tester/priv", private=True, files={"config.json": b"{}"})
    hub_server.create_repo("tester/gated", files={"config.json": b"{}"})
    hub_server.set_gated("tester/gated")
    code = ERRORS_HELPER + """
from huggingface_hub import HfApi, hf_hub_download
anon, bad, other, owner = HfApi(token=False), HfApi(token="hf_not_a_valid_token"), HfApi(token=OTHER), HfApi(token=OWNER)
dl = lambda repo, token: hf_hub_download(repo, "config.json", token=token)
up = lambda api, repo: api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo)
result = {
    "anon_read_public": catch(dl, "tester/pub", False),
    "anon_read_private": catch(dl, "tester/priv", False),
    "anon_info_private": catch(anon.repo_info, "tester/priv"),
    "anon_create": catch(anon.create_repo, "tester/new"),
    "anon_upload": catch(up, anon, "tester/pub"),
    "bad_info_public": catch(bad.repo_info, "tester/pub"),
    "bad_upload": catch(up, bad, "tester/pub"),
    "other_upload": catch(up, other, "tester/pub"),
    "other_create_in_tester": catch(other.create_repo, "tester/new"),
    "other_create_exist_ok": str(other.create_repo("tester/pub", exist_ok=True)),
    "other_read_private": catch(dl, "tester/priv", OTHER),
    "other_read_gated": catch(dl, "tester/gated", OTHER),
    "owner_read_private": catch(dl, "tester/priv", OWNER),
    "owner_read_gated": catch(dl, "tester/gated", OWNER),
    "other_create_own": other.create_repo("someone-else/mine").repo_id,
}
"""
    out = hub_client(snippet(code, OTHER=OTHER_TOKEN, OWNER=DEFAULT_TOKEN)).unwrap()
    assert out["anon_read_public"] is None
    assert out["owner_read_private"] is None and out["owner_read_gated"] is None
    for key in ("anon_read_private", "anon_info_private", "anon_upload"):
        assert "RepositoryNotFoundError" in out[key]["mro"] and out[key]["status"] == 401, (key, out[key])
    assert out["other_read_private"]["status"] == 404
    assert "RepositoryNotFoundError" in out["other_read_private"]["mro"]
    assert "GatedRepoError" in out["other_read_gated"]["mro"] and out["other_read_gated"]["status"] == 403
    # invalid token: a plain 401, not disguised as a missing repo
    for key in ("anon_create", "bad_info_public", "bad_upload"):
        assert out[key]["status"] == 401 and "RepositoryNotFoundError" not in out[key]["mro"], (key, out[key])
    for key in ("other_upload", "other_create_in_tester"):
        assert out[key]["status"] == 403 and out[key]["mro"][0] == "HfHubHTTPError", (key, out[key])
    assert out["other_create_exist_ok"].endswith("/tester/pub")
    assert out["other_create_own"] == "someone-else/mine"
    assert hub_server.files("tester/pub") == {".gitattributes": DEFAULT_GITATTRIBUTES, "config.json": b"{}"}


def test_token_is_never_stored_nor_sent_to_lfs_storage(hub_server_factory, tmp_path):
    hub = hub_server_factory(lfs_suffixes=(".safetensors",))
    adapter_folder(tmp_path / "adapter")
    home = tmp_path / "home"
    run_client(snippet("""
from huggingface_hub import HfApi, snapshot_download
HfApi().create_repo("tester/leak")
HfApi().upload_folder(repo_id="tester/leak", folder_path=FOLDER)
snapshot_download("tester/leak")
""", FOLDER=str(tmp_path / "adapter")), env=client_env(hub, hf_home=home)).unwrap()
    assert hub.find_bytes(DEFAULT_TOKEN) == []
    puts = hub.requests_to("PUT")
    assert puts and all(r.authorization is None for r in puts)
    others = [r for r in hub.requests if r.method != "PUT"]
    assert all(r.authorization == f"Bearer {DEFAULT_TOKEN}" for r in others)
    for path in home.rglob("*"):
        if path.is_file():
            assert DEFAULT_TOKEN.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------------------- cache, offline, network down


def test_reread_from_cache_offline_and_with_server_down(hub_server, hub_client, hf_home):
    sha = hub_server.create_repo("tester/cache", files={"config.json": b'{"v": 1}', "w.bin": b"w" * 100})
    read = """
import os
from huggingface_hub import hf_hub_download, snapshot_download
p = hf_hub_download("tester/cache", "config.json")
s = snapshot_download("tester/cache")
result = {"config": open(p).read(), "snapshot": s, "files": sorted(os.listdir(s))}
"""
    online = hub_client(read).unwrap()
    assert online["snapshot"].endswith(sha) and online["config"] == '{"v": 1}'

    hub_server.clear_requests()
    offline = hub_client(read, offline=True).unwrap()
    assert offline == online
    assert hub_server.requests == []  # HF_HUB_OFFLINE=1: nothing reached the server

    missing = hub_client("""
from huggingface_hub import hf_hub_download
hf_hub_download("tester/cache", "not-cached.json")
""", offline=True)
    assert missing.raised("LocalEntryNotFoundError"), missing.error

    hub_server.stop()  # "network down": connection refused on the same URL
    try:
        # cached files are served from the cache at once.  (A file that is NOT cached makes the
        # client retry with backoff for ~25 s before LocalEntryNotFoundError: not tested here.)
        down = hub_client(read)
        assert down.unwrap() == online
    finally:
        hub_server.start()
    assert hub_server.head("tester/cache") == sha  # state survives a restart
    assert hub_client("from huggingface_hub import HfApi\nresult = HfApi().repo_info('tester/cache').sha").unwrap() == sha


# ---------------------------------------------------------------------------- olah (third-party mirror, read side)


@pytest.mark.skipif(not olah_available()[0], reason=olah_available()[1] or "olah unavailable")
def test_olah_mirror_read_path(tmp_path):
    weights = os.urandom(3000)
    files = {"adapter_config.json": b'{"v": 1}', "adapter_model.safetensors": weights, "sub/notes.txt": b"n"}
    with serve_with_olah(files, "tester/olah-demo", branches={"v2": {"adapter_config.json": b'{"v": 2}'}},
                         tags=["v1.0"], lfs_suffixes=(".safetensors",)) as endpoint:
        code = snippet("""
import hashlib, os
from huggingface_hub import hf_hub_download, list_repo_files, list_repo_refs, snapshot_download
repo = "tester/olah-demo"
read = lambda rev: open(hf_hub_download(repo, "adapter_config.json", revision=rev)).read()
snap = snapshot_download(repo, revision="main")
result = {
    "files": sorted(list_repo_files(repo)),
    "main": read("main"), "v2": read("v2"), "tag": read("v1.0"), "sha": read(MAIN_SHA),
    "weights": hashlib.sha256(open(hf_hub_download(repo, "adapter_model.safetensors"), "rb").read()).hexdigest(),
    "snapshot": sorted(os.listdir(snap)),
    "branches": sorted(b.name for b in list_repo_refs(repo).branches),
}
""", MAIN_SHA=endpoint.refs["main"])
        out = run_client(code, env=client_env(endpoint, hf_home=tmp_path / "home", token=None)).unwrap()
    assert out["files"] == ["adapter_config.json", "adapter_model.safetensors", "sub/notes.txt"]
    assert (out["main"], out["v2"], out["tag"], out["sha"]) == ('{"v": 1}', '{"v": 2}', '{"v": 1}', '{"v": 1}')
    assert out["weights"] == hashlib.sha256(weights).hexdigest()
    assert out["snapshot"] == ["adapter_config.json", "adapter_model.safetensors", "sub"]
    assert out["branches"] == ["main", "v2"]
