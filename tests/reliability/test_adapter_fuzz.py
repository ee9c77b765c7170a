"""Property-based fuzzing of the adapter reader: random byte flips and truncations of a real (tiny)
adapter file give either exactly the saved tensors or a clear AdapterError, never NaNs, another
exception or a hang. Bounded (examples and per-example deadline) so it runs in CI in seconds."""

from __future__ import annotations

import shutil
import signal
import struct
from contextlib import contextmanager
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_support import make_adapter, same_tensors

from bitfit_hf import AdapterError, BitFitAdapter
from bitfit_hf.utils.constants import WEIGHTS_NAME

FUZZ = settings(max_examples=120, deadline=timedelta(seconds=5), derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    _, adapter_dir, tensors = make_adapter(root)
    data = (adapter_dir / WEIGHTS_NAME).read_bytes()
    return adapter_dir, data, tensors


@contextmanager
def hard_limit(seconds: int):
    """A hang fails the example instead of stalling the suite."""
    def expire(*_):
        raise TimeoutError(f"the reader took more than {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def load_mutated(original, tmp_path_factory, mutated: bytes):
    adapter_dir, _, tensors = original
    target = tmp_path_factory.mktemp("case")
    shutil.copytree(adapter_dir, target, dirs_exist_ok=True)
    (target / WEIGHTS_NAME).write_bytes(mutated)
    try:
        with hard_limit(20):
            loaded = BitFitAdapter.from_pretrained(str(target))
    except AdapterError as err:
        assert str(err), "an AdapterError must say what is wrong"
        return
    finally:
        shutil.rmtree(target, ignore_errors=True)
    # Loaded: it must be the saved adapter, bit for bit (so no NaN and no garbage either).
    assert same_tensors(loaded.tensors, tensors), "a damaged adapter loaded with different tensors"


@FUZZ
@given(data=st.data())
def test_byte_flips_give_the_exact_tensors_or_an_adapter_error(original, tmp_path_factory, data):
    raw = bytearray(original[1])
    # Each flip lands in the header (length, JSON, embedded config) or in the tensor data, both often:
    # left to itself hypothesis favours small offsets, i.e. the header.
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    region = st.one_of(st.integers(0, start - 1), st.integers(start, len(raw) - 1))
    flips = data.draw(st.lists(st.tuples(region, st.integers(1, 255)), min_size=1, max_size=4))
    for position, mask in flips:
        raw[position] ^= mask
    load_mutated(original, tmp_path_factory, bytes(raw))


@FUZZ
@given(data=st.data())
def test_truncations_give_an_adapter_error(original, tmp_path_factory, data):
    raw = original[1]
    length = data.draw(st.integers(0, len(raw) - 1))
    load_mutated(original, tmp_path_factory, raw[:length])


def test_flips_inside_the_tensor_data_are_all_caught(original, tmp_path_factory):
    """Not left to chance: a flip in every 16th byte of the tensor data region is an AdapterError."""
    import json

    raw = original[1]
    (header,) = struct.unpack("<Q", raw[:8])
    start = 8 + header
    assert json.loads(raw[8:start])  # the region below is the data, not the header
    for position in range(start, len(raw), 16):
        mutated = bytearray(raw)
        mutated[position] ^= 0x01
        with pytest.raises(AdapterError, match="corrupt"):
            load_mutated_strict(original, tmp_path_factory, bytes(mutated))


def load_mutated_strict(original, tmp_path_factory, mutated: bytes):
    adapter_dir, _, _ = original
    target = tmp_path_factory.mktemp("strict")
    shutil.copytree(adapter_dir, target, dirs_exist_ok=True)
    (target / WEIGHTS_NAME).write_bytes(mutated)
    try:
        return BitFitAdapter.from_pretrained(str(target))
    finally:
        shutil.rmtree(target, ignore_errors=True)
