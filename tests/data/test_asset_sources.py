"""An asset with several sources: tried in order, the one that served named, every failure reported; and the
availability check of every pinned source against a package index (a local file index here, no network)."""

from __future__ import annotations

import hashlib
import io
import logging
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from bitfit_hf.cli.main import main as cli_main
from bitfit_hf.data.assets import ASSETS, AssetDownloadError, AssetNotFoundError, AssetSpec, asset_status, download, fetch
from bitfit_hf.data.assets.availability import check_sources, pinned_sources
from bitfit_hf.data.assets.specs import ArchiveSource

PAYLOAD = b"question\tanswer\n" * 64
EQUIVALENT = b"question\tanswer\r\n" * 64  # the same rows as another source writes them


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sdist(folder: Path, package: str, version: str, member: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo(f"{package}-{version}/{member}")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return path


def _wheel(folder: Path, package: str, version: str, member: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{package}-{version}.dist-info/METADATA", f"Name: {package}\n")
    return path


def _spec(**kwargs) -> AssetSpec:
    fields = dict(name="fake", package="gonepkg", version="1.0.0", members=("data/rows.tsv",), sha256=_sha(PAYLOAD),
                  size=len(PAYLOAD), description="rows for tests", license="none", approx_download="1 KB",
                  alternatives=(ArchiveSource("keptpkg", "2.0.0", ("keptpkg/rows.tsv",), kind="wheel"),))
    fields.update(kwargs)
    return AssetSpec(**fields)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BITFIT_HF_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("BITFIT_HF_ASSET_ARCHIVES", raising=False)
    return tmp_path / "cache"


def _fake_pip(tmp_path: Path, monkeypatch, served: dict[str, Path]) -> Path:
    """A ``pip`` that serves the archives in ``served`` (requirement -> file) and fails like pip for the rest."""
    calls = tmp_path / "pip_calls.txt"
    script = tmp_path / "fake_pip.py"
    script.write_text(
        "import shutil, sys\n"
        f"served = {({k: str(v) for k, v in served.items()})!r}\n"
        "req = next(a for a in sys.argv if '==' in a)\n"
        f"open({str(calls)!r}, 'a').write(req + '\\n')\n"
        "if req not in served:\n"
        "    sys.stderr.write(f'ERROR: Could not find a version that satisfies the requirement {req}\\n')\n"
        "    sys.exit(1)\n"
        "shutil.copy(served[req], sys.argv[sys.argv.index('-d') + 1])\n"
    )
    monkeypatch.setattr(download, "PIP_COMMAND", [sys.executable, str(script)])
    return calls


def test_the_second_source_serves_when_the_first_is_gone(cache, tmp_path, monkeypatch, caplog):
    wheel = _wheel(tmp_path / "registry", "keptpkg", "2.0.0", "keptpkg/rows.tsv", PAYLOAD)
    calls = _fake_pip(tmp_path, monkeypatch, {"keptpkg==2.0.0": wheel})
    monkeypatch.setitem(ASSETS, "fake", _spec())
    with caplog.at_level(logging.INFO, logger="bitfit_hf.data.assets"):
        path = fetch("fake")
    assert path.read_bytes() == PAYLOAD
    assert calls.read_text().split() == ["gonepkg==1.0.0", "keptpkg==2.0.0"]  # in order, the first tried first
    assert "fake: served by the keptpkg==2.0.0 wheel" in caplog.text
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.tsv"]  # nothing half-written beside it


def test_every_source_failing_is_one_error_naming_each_and_the_way_in(cache, tmp_path, monkeypatch):
    _fake_pip(tmp_path, monkeypatch, {})
    monkeypatch.setitem(ASSETS, "fake", _spec())
    with pytest.raises(AssetDownloadError) as err:
        fetch("fake")
    message = str(err.value)
    assert "tried 2" in message and "gonepkg==1.0.0" in message and "keptpkg==2.0.0" in message
    assert "Could not find a version" in message  # pip's own words, for each source
    assert "pip download --no-deps --no-binary :all: gonepkg==1.0.0" in message
    assert "pip download --no-deps --only-binary :all: keptpkg==2.0.0" in message
    assert "--from-dir DIR" in message
    assert asset_status("fake") == "missing"


def test_an_equivalent_source_with_its_own_hash_counts_as_a_good_copy(cache, tmp_path, monkeypatch):
    alternative = ArchiveSource("keptpkg", "2.0.0", ("keptpkg/rows.tsv",), kind="wheel",
                                sha256=_sha(EQUIVALENT), size=len(EQUIVALENT))
    wheel = _wheel(tmp_path / "registry", "keptpkg", "2.0.0", "keptpkg/rows.tsv", EQUIVALENT)
    _fake_pip(tmp_path, monkeypatch, {"keptpkg==2.0.0": wheel})
    monkeypatch.setitem(ASSETS, "fake", _spec(alternatives=(alternative,)))
    assert fetch("fake").read_bytes() == EQUIVALENT
    assert asset_status("fake", verify=True) == "ok"
    fetch("fake").write_bytes(PAYLOAD[:-1] + b"X")  # neither source's bytes: corrupt
    assert asset_status("fake", verify=True) == "corrupt"


def test_a_wrong_copy_of_the_first_source_falls_through_to_the_next(cache, tmp_path, monkeypatch):
    folder = tmp_path / "archives"
    _sdist(folder, "gonepkg", "1.0.0", "data/rows.tsv", b"tampered")
    _wheel(folder, "keptpkg", "2.0.0", "keptpkg/rows.tsv", PAYLOAD)
    monkeypatch.setitem(ASSETS, "fake", _spec())
    assert fetch("fake", from_dirs=[folder]).read_bytes() == PAYLOAD


def test_a_folder_only_source_serves_from_a_folder_and_is_never_downloaded(cache, tmp_path, monkeypatch):
    calls = _fake_pip(tmp_path, monkeypatch, {})
    kept = ArchiveSource("oldpkg", "0.9", ("old/rows.tsv",), indexed=False)
    monkeypatch.setitem(ASSETS, "fake", _spec(alternatives=(kept,)))
    with pytest.raises(AssetDownloadError, match="oldpkg==0.9 source archive: no longer offered by the index"):
        fetch("fake")
    assert "oldpkg" not in calls.read_text()
    folder = tmp_path / "kept"
    _sdist(folder, "oldpkg", "0.9", "old/rows.tsv", PAYLOAD)
    monkeypatch.setenv("BITFIT_HF_ASSET_ARCHIVES", str(folder))
    assert fetch("fake").read_bytes() == PAYLOAD
    assert [s.requirement for s in pinned_sources(["fake"])] == ["gonepkg==1.0.0"]  # the index is not asked


def test_from_dir_without_any_source_names_every_source(cache, tmp_path, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    (tmp_path / "empty").mkdir()
    with pytest.raises(AssetNotFoundError) as err:
        fetch("fake", from_dirs=[tmp_path / "empty"])
    assert "gonepkg==1.0.0" in str(err.value) and "keptpkg==2.0.0" in str(err.value)


# --------------------------------------------------------------------------- the availability check


def _file_index(root: Path, offered: dict[str, list[str]]) -> str:
    """A PEP 503 index in a folder: one page per project listing an sdist of each offered version."""
    for project, versions in offered.items():
        page = root / "simple" / project
        page.mkdir(parents=True)
        files = root / "files"
        files.mkdir(exist_ok=True)
        links = []
        for version in versions:
            name = f"{project}-{version}.tar.gz"
            (files / name).write_bytes(b"")
            links.append(f'<a href="../../files/{name}">{name}</a>')
        page.joinpath("index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    return (root / "simple").as_uri()


def test_check_flags_a_pinned_version_the_index_no_longer_offers(tmp_path, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    url = _file_index(tmp_path / "index", {"gonepkg": ["0.0.1"], "keptpkg": ["1.0.0", "2.0.0"]})
    results = {r.source.requirement: r for r in check_sources(["fake"], index_url=url)}
    assert not results["gonepkg==1.0.0"].offered and results["gonepkg==1.0.0"].versions == ("0.0.1",)
    assert results["keptpkg==2.0.0"].offered


def test_cli_check_exits_1_with_one_line_naming_the_asset_and_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(ASSETS, "fake", _spec())
    url = _file_index(tmp_path / "index", {"gonepkg": ["0.0.1"], "keptpkg": ["2.0.0"]})
    assert cli_main(["assets", "check", "fake", "--index-url", url]) == 1
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fake: gonepkg==1.0.0 is no longer offered by the package index")
    assert "it offers 0.0.1" in lines[0] and "1 other source" in lines[0] and "--from-dir DIR" in lines[0]
    assert "1 of 2 pinned sources" in out.out
    url = _file_index(tmp_path / "index2", {"gonepkg": ["1.0.0"], "keptpkg": ["2.0.0"]})
    assert cli_main(["assets", "check", "fake", "--index-url", url]) == 0


def test_check_reports_a_project_the_index_does_not_know(tmp_path, monkeypatch):
    monkeypatch.setitem(ASSETS, "fake", _spec(alternatives=()))
    url = _file_index(tmp_path / "index", {"otherpkg": ["1.0"]})
    (result,) = check_sources(["fake"], index_url=url)
    assert not result.offered and result.versions == () and result.detail


def test_every_real_asset_has_a_pinned_source_the_check_asks_about():
    pinned = pinned_sources()
    assert {p.asset for p in pinned} == set(ASSETS) | {"minilm", "smollm2", "mpnet"}
    assert sum(p.asset == "mpnet" for p in pinned) == 5  # each part of the split model
