"""The hooks of the program's own synchronises as transparent mode installs them
on a GPU (:func:`~numba_streamsafe.numba.program_order.stream_synchronize_hook`
on Numba's ``Stream.synchronize``,
:func:`~numba_streamsafe.numba.program_order.event_completed_hook` on
``Event.synchronize`` and ``Event.query``), run here against the simulated
driver with stand-ins for Numba's stream and event objects, whose methods call
the simulated driver.

A write of ``x`` on stream ``a``, then the program's synchronise, then a read
of ``x`` on stream ``b``: through the hook the resource learns that the host
saw the write complete, and the read needs no wait and no event of the
library's; the same synchronise unhooked (the library not told) leaves the
library its own wait. A synchronise that fails, or a query that says the event
has not completed, tells the resource nothing complete: the read waits. No
case races; the read queued with no wait and no synchronise does (the
negative control).
"""

from __future__ import annotations

from typing import Any

import pytest

from numba_streamsafe import Access
from numba_streamsafe.numba import program_order
from tests.helpers.numba_objects import NumbaEvent, NumbaStream
from tests.helpers.programs import launch


class _Failed(RuntimeError):
    """Numba's error for a synchronise the driver refused."""


def _installed(hook: Any, name: str, original: Any, base: type = object) -> type:
    """A subclass of ``base`` with the hook of ``original`` installed as its
    method ``name``, as transparent mode installs it on Numba's class
    (``setattr``)."""
    cls = type("NumbaClass", (base,), {})
    setattr(cls, name, hook(original))
    return cls


def _written(rt: Any, stream_class: type = NumbaStream) -> tuple:
    """The simulated driver, stream ``a`` (a ``stream_class`` object that owns
    its handle, as Numba's does), stream ``b``, and ``x`` written on ``a``."""
    sim = rt.driver
    a, b = stream_class(sim.create_stream()), sim.create_stream()
    x = rt.resource.allocate(256, a.handle, "x")
    launch(rt, a, [(x, Access.WRITE)], label="write x on a")
    return sim, a, b, x


def _counts(rt: Any) -> tuple[int, int]:
    """The library's waits queued so far and the events recorded on the driver."""
    return rt.resource.marks.waits, rt.driver.calls["cuEventRecord"]


@pytest.mark.parametrize("hooked", [True, False], ids=["hooked", "unhooked"])
def test_a_stream_synchronize_orders_a_later_read_with_no_wait(rt, hooked):
    def synchronize(self: Any) -> None:  # Numba's Stream.synchronize
        rt.driver.stream_synchronize(self.handle)

    hook = program_order.stream_synchronize_hook if hooked else (lambda original: original)
    sim, a, b, x = _written(rt, _installed(hook, "synchronize", synchronize, NumbaStream))
    waits, recorded = _counts(rt)
    a.synchronize()  # the method of the stream object that wrote x
    launch(rt, b, [(x, Access.READ)], label="read x on b")
    sim.assert_no_hazards()
    if hooked:  # the host saw the write complete: nothing to wait for
        assert _counts(rt) == (waits, recorded)
    else:  # the library was not told: its own wait, for its own event
        assert _counts(rt) == (waits + 1, recorded + 1)


def test_a_failed_stream_synchronize_leaves_the_read_waiting(rt):
    sim, a, b, x = _written(rt)

    def synchronize(self: Any) -> None:
        raise _Failed("cuStreamSynchronize failed")

    waits, recorded = _counts(rt)
    with pytest.raises(_Failed):
        program_order.stream_synchronize_hook(synchronize)(a)
    # Not seen complete: the mark the synchronise closed gets its event at once.
    assert _counts(rt) == (waits, recorded + 1)
    launch(rt, b, [(x, Access.READ)], label="read x on b")
    sim.assert_no_hazards()
    assert _counts(rt) == (waits + 1, recorded + 1)  # the wait for that event


def test_the_read_races_with_no_wait_and_no_synchronise(rt):
    """The negative control: the read of ``x`` on ``b``, queued unfenced."""
    sim, a, b, x = _written(rt)
    launch(rt, b, [(x, Access.READ)], fenced=False, label="read x on b, no wait")
    assert sim.hazards, "the read on b must be ordered after the write on a"


@pytest.mark.parametrize("how", ["synchronize", "query done", "query not done"])
def test_an_event_seen_complete_orders_a_later_read_with_no_wait(rt, how):
    """The program records its event on ``a`` after the write (Numba's
    ``Event.record``, hooked), then synchronises it or queries it through the
    hook: seen complete, the read on ``b`` needs no wait; a query that says
    not yet leaves the read waiting for the program's event (no event of the
    library's)."""
    sim, a, b, x = _written(rt)

    def record(self: Any, stream: Any = 0) -> None:  # Numba's Event.record
        sim.event_record(self.handle, stream.handle)

    def synchronize(self: Any) -> None:  # Numba's Event.synchronize
        sim.event_synchronize(self.handle)

    def query(self: Any) -> bool:  # Numba's Event.query, as the driver answers it
        return how == "query done"

    event = NumbaEvent(sim.event_create())
    program_order.record_hook(record)(event, a)
    waits, recorded = _counts(rt)
    if how == "synchronize":
        assert program_order.event_completed_hook(synchronize)(event) is None
    else:
        if how == "query done":
            sim.event_synchronize(event.handle)  # what the query found
        method = _installed(program_order.event_completed_hook, "query", query)
        assert method.query.__name__ == "query"
        assert method.query(event) is (how == "query done")
    launch(rt, b, [(x, Access.READ)], label="read x on b")
    sim.assert_no_hazards()
    if how == "query not done":  # the read waits for the program's event
        assert _counts(rt) == (waits + 1, recorded)
    else:
        assert _counts(rt) == (waits, recorded)
