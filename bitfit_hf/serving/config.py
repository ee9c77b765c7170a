"""What ``bitfit-hf serve`` serves and under which limits: adapter specs (flags or a YAML / JSON file)
and :class:`ServeConfig`."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from bitfit_hf.inference.inputs import DOC_STRIDE
from bitfit_hf.utils.errors import UserError, first_line

#: The environment variable holding the admin token (the admin routes are off without it).
ADMIN_TOKEN_ENV = "BITFIT_HF_ADMIN_TOKEN"
#: Adapter names: what a client writes in ``"adapter"`` and in URLs.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ServeError(UserError, ValueError):
    """A serving configuration or an adapter the server refuses (one line, says why)."""


#: ``--dtype`` choices: the base's weights in that dtype; ``auto`` picks bfloat16 on a CUDA device, float32 elsewhere.
DTYPES = ("auto", "float32", "bfloat16", "float16")
PACKING = ("auto", "off")


@dataclass
class AdapterSpec:
    """One adapter to serve: its name in requests, a local folder or Hub id, and a Hub revision."""

    name: str
    source: str
    revision: Optional[str] = None

    def describe(self) -> str:
        return f"{self.source}@{self.revision}" if self.revision else self.source


@dataclass
class ServeConfig:
    """Limits and batching of a server. The defaults follow text-embeddings-inference where it has one."""

    max_batch_size: int = 32          # examples in one forward pass
    max_batch_tokens: int = 16384     # padded tokens (rows x longest row) in one forward pass
    max_wait_ms: float = 2.0          # how long the first request of a batch waits for others
    max_queue: int = 256              # requests waiting (503 with Retry-After beyond)
    max_client_batch_size: int = 32   # inputs in one request (413 beyond)
    max_input_length: Optional[int] = None  # tokens per input; None: the model's / tokenizer's limit
    payload_limit: int = 2_000_000    # bytes of one request body (413 beyond)
    request_timeout_s: float = 30.0   # from arrival to answer (504 beyond)
    retry_after_s: int = 1            # the Retry-After of a 503
    auto_truncate: bool = False       # truncate over-long inputs when the request does not say
    batching: str = "mixed"           # "mixed": tasks share forward passes; "switch": one adapter per pass
    device: str = "auto"
    dtype: str = "auto"               # "auto": bfloat16 on a CUDA device, float32 on a CPU
    threads: Optional[int] = None     # torch intra-op threads of the worker; None: torch's default
    doc_stride: int = DOC_STRIDE      # tokens two neighbouring windows of a long QA context share
    packing: str = "auto"             # "auto": an encoder's mixed passes packed where a probe shows it exact; "off"

    def __post_init__(self):
        positive = {"max_batch_size": self.max_batch_size, "max_batch_tokens": self.max_batch_tokens, "max_queue": self.max_queue,
                    "max_client_batch_size": self.max_client_batch_size, "payload_limit": self.payload_limit,
                    "request_timeout_s": self.request_timeout_s}
        for key, value in positive.items():
            if not value or value <= 0:
                raise ServeError(f"--{key.replace('_', '-')} must be positive (got {value}).")
        if self.max_wait_ms < 0:
            raise ServeError(f"--max-wait-ms must be 0 or more (got {self.max_wait_ms}).")
        if self.max_input_length is not None and self.max_input_length <= 0:
            raise ServeError(f"--max-input-length must be positive (got {self.max_input_length}).")
        if self.max_client_batch_size > self.max_batch_size:
            raise ServeError(f"--max-client-batch-size ({self.max_client_batch_size}) cannot exceed --max-batch-size "
                             f"({self.max_batch_size}): one request's inputs go into one forward pass.")
        if self.batching not in ("mixed", "switch"):
            raise ServeError(f"--batching is 'mixed' or 'switch', not {self.batching!r}.")
        if self.dtype not in DTYPES:
            raise ServeError(f"--dtype is {', '.join(DTYPES)}, not {self.dtype!r}.")
        if self.packing not in PACKING:
            raise ServeError(f"--packing is {' or '.join(PACKING)}, not {self.packing!r}.")
        if self.doc_stride < 0:
            raise ServeError(f"--doc-stride must be 0 or more (got {self.doc_stride}).")
        if self.threads is not None and self.threads <= 0:
            raise ServeError(f"--threads must be positive (got {self.threads}).")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def require_specs(specs: List["AdapterSpec"]) -> None:
    """Refuse an empty adapter list, the same way wherever a server starts (one process, workers, Ray)."""
    if not specs:
        raise ServeError("no adapters to serve: give one or more NAME=SOURCE (a folder or a Hub id), or --adapters-file.")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ServeError(f"adapter name {name!r} is not usable: 1-64 characters, letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit.")
    return name


def default_name(source: str) -> str:
    """``outputs/glue-sst2-bitfit`` -> ``glue-sst2-bitfit``; ``me/minilm-sst2`` -> ``minilm-sst2``."""
    return os.path.basename(os.path.normpath(os.path.expanduser(source))) or source


def parse_adapter_arg(text: str) -> AdapterSpec:
    """``NAME=SOURCE[@REVISION]`` or ``SOURCE[@REVISION]`` (the name is then the folder / repo name). A
    revision is read only for Hub ids (a local folder may contain ``@``)."""
    name, sep, source = text.partition("=")
    if not sep:
        name, source = "", text
    revision = None
    local = os.path.exists(os.path.expanduser(source))
    if "@" in source and not local:
        source, _, revision = source.rpartition("@")
    if not source:
        raise ServeError(f"--adapter {text!r}: give NAME=SOURCE (a folder or a Hub id, optionally @REVISION).")
    return AdapterSpec(check_name(name or default_name(source)), source, revision or None)


def read_adapters_file(path: str) -> tuple:
    """``(specs, base_model or None)`` from a YAML or JSON file::

        base_model: sentence-transformers/all-MiniLM-L6-v2   # optional
        adapters:
          sst2: outputs/glue-sst2-bitfit
          mnli: {source: me/minilm-mnli-bitfit, revision: v1.0}

    ``adapters`` may also be a list of ``{name, source, revision}``."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise ServeError(f"cannot read the adapters file {path!r}: {err.strerror or err}.") from None
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as err:  # noqa: BLE001 - json / yaml parse errors, one line
        raise ServeError(f"the adapters file {path!r} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                         f"{first_line(err)}") from None
    if not isinstance(data, dict) or "adapters" not in data:
        raise ServeError(f"the adapters file {path!r} needs an 'adapters' mapping (name: folder or Hub id).")
    entries = data["adapters"]
    specs: List[AdapterSpec] = []
    if isinstance(entries, dict):
        entries = [{"name": k, **(v if isinstance(v, dict) else {"source": v})} for k, v in entries.items()]
    if not isinstance(entries, list):
        raise ServeError(f"'adapters' in {path!r} must be a mapping or a list.")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
            raise ServeError(f"adapter entry {entry!r} in {path!r} needs a 'source' (a folder or a Hub id).")
        source = entry["source"]
        if not os.path.isabs(os.path.expanduser(source)) and not source.startswith("~"):
            beside = os.path.join(os.path.dirname(os.path.abspath(path)), source)
            if os.path.isdir(beside) and not os.path.isdir(source):  # relative to the file
                source = beside
        revision = entry.get("revision")
        specs.append(AdapterSpec(check_name(str(entry.get("name") or default_name(source))), source,
                                 str(revision) if revision is not None else None))
    base = data.get("base_model")
    return specs, (str(base) if base else None)


def unique_specs(specs: List[AdapterSpec]) -> List[AdapterSpec]:
    seen: Dict[str, AdapterSpec] = {}
    for spec in specs:
        if spec.name in seen:
            raise ServeError(f"two adapters are named {spec.name!r} ({seen[spec.name].describe()} and {spec.describe()}); "
                             "name them with NAME=SOURCE.")
        seen[spec.name] = spec
    return list(seen.values())


__all__ = ["ADMIN_TOKEN_ENV", "AdapterSpec", "ServeConfig", "ServeError", "check_name", "parse_adapter_arg",
           "read_adapters_file", "unique_specs"]
