"""A thread's OS name (what ``top -H`` and /proc show): set for the calling thread only, cut to the kernel's 15
bytes, and inherited by the threads it starts afterwards (torch's OpenMP threads under the server's worker)."""

from __future__ import annotations

import sys
import threading

import pytest

from bitfit_hf.utils.os_threads import MAX_NAME_BYTES, name_os_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def os_name(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/comm") as handle:
        return handle.read().strip()


def in_thread(fn):
    """Run ``fn`` on a new thread; its result."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(value=fn()))
    thread.start()
    thread.join(30)
    return out["value"]


def test_the_calling_thread_alone_takes_the_name_cut_to_the_kernels_length():
    main_before = os_name(threading.main_thread().native_id)

    def named():
        assert name_os_thread("bitfit-a-rather-long-thread-name") is True
        return os_name(threading.get_native_id())

    assert in_thread(named) == "bitfit-a-rather-long-thread-name"[:MAX_NAME_BYTES]
    assert os_name(threading.main_thread().native_id) == main_before


def test_threads_started_after_the_name_inherit_it():
    def parent():
        name_os_thread("bitfit-parent")
        return in_thread(lambda: os_name(threading.get_native_id()))

    assert in_thread(parent) == "bitfit-parent"
