"""``--packing``: a server packs its encoder's mixed passes by default, once the probe agrees, and answers what the
padded passes of ``--packing off`` answer; a wrong value is a clear error."""

from __future__ import annotations

import pytest
from serve_support import adapters, call, predict, specs, start_server  # noqa: F401 - fixtures

from bitfit_hf.serving.config import ServeConfig, ServeError

TEXTS = ["a b c d e f g h i j k", "a b", "c d e f", "g", "h i j k l m n", "o p q"]
ATOL = 1e-5


def _answers(server, names):
    return [predict(server.url, {"inputs": [text, TEXTS[-1 - i]], "adapter": names[i % len(names)]})
            for i, text in enumerate(TEXTS)]


def test_packed_and_padded_servers_answer_the_same(adapters, start_server):  # noqa: F811
    names = ["c0", "c1", "ab", "tag"]
    packed = start_server(specs(adapters, *names))
    padded = start_server(specs(adapters, *names), packing="off")
    groups = {server: [g for g in server.engine.registry.groups.values() if g.mode == "mixed"]
              for server in (packed, padded)}
    got, want = _answers(packed, names), _answers(padded, names)
    assert all(g.packs for g in groups[packed]) and not any(g.packs for g in groups[padded])
    assert packed.engine.info()["packing"] == "auto"
    listed = {server: {a["name"]: a["packed"] for a in call(server.url, "GET", "/adapters")[2]} for server in (packed, padded)}
    assert listed[packed] == dict.fromkeys(names, True) and listed[padded] == dict.fromkeys(names, False)
    for (status, _, body), (status_off, _, body_off) in zip(got, want):
        assert status == status_off == 200
        _same(body, body_off)


def _same(one, other):
    """Equal answers: every string and structure alike, every number within ``ATOL``."""
    if isinstance(one, dict):
        assert one.keys() == other.keys()
        for key in one:
            _same(one[key], other[key])
    elif isinstance(one, list):
        assert len(one) == len(other)
        for a, b in zip(one, other):
            _same(a, b)
    elif isinstance(one, float):
        assert one == pytest.approx(other, abs=ATOL)
    else:
        assert one == other


def test_an_unknown_packing_is_refused_with_the_choices():
    with pytest.raises(ServeError, match="--packing is auto or off"):
        ServeConfig(packing="always")
