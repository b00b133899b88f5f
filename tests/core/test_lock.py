"""The engine's lock (``resources.lock.Lock``): mutual exclusion under
threads that hand the GIL over inside the critical section, timeouts,
non-blocking acquires, and :class:`threading.Lock`'s errors, on whichever
build runs (CI runs the suite on both)."""

from __future__ import annotations

import threading
import time

import pytest

from numba_streamsafe.resources.tracking.lock import Lock


def test_threads_that_yield_inside_never_overlap():
    lock = Lock()
    inside = [0]
    overlaps = [0]
    total = [0]

    def work() -> None:
        for i in range(2000):
            with lock:
                inside[0] += 1
                if inside[0] != 1:
                    overlaps[0] += 1
                if i % 7 == 0:
                    time.sleep(0)  # the GIL goes to another thread while the lock is held
                value = total[0]
                time.sleep(0) if i % 11 == 0 else None
                total[0] = value + 1
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread never got the lock"
    assert overlaps[0] == 0
    assert total[0] == 6 * 2000
    assert not lock.locked()


def test_a_timed_acquire_gives_up_and_a_release_wakes_a_waiter():
    lock = Lock()
    assert lock.acquire()
    t0 = time.monotonic()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.05)))
    waiter.start()
    waiter.join(timeout=10)
    assert got == [False] and time.monotonic() - t0 >= 0.04
    assert not lock.acquire(blocking=False)

    woke = threading.Event()

    def wait_then_release() -> None:
        lock.acquire()
        woke.set()
        lock.release()

    waiter = threading.Thread(target=wait_then_release)
    waiter.start()
    time.sleep(0.05)
    assert not woke.is_set()  # it waits while the lock is held
    lock.release()
    waiter.join(timeout=10)
    assert woke.is_set() and not lock.locked()
    assert lock.acquire(timeout=0.5)
    lock.release()


def test_threading_lock_errors():
    lock = Lock()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        lock.acquire(True, -2)
