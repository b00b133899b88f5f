"""Boundaries of the library's arrays with other code: an exported
``__cuda_array_interface__`` ordered for its consumer (:func:`export_interface`),
and an array lent to code that uses it on a stream of its own (:func:`lend`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from numba_streamsafe.core.access import Access, as_access
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.numba import target
from numba_streamsafe.numba.array_args import device_block, is_tracking
from numba_streamsafe.numba.interop.exports import order_export
from numba_streamsafe.protocol import commit, preflight, single
from numba_streamsafe.runtime import get_runtime

__all__ = ["export_interface", "lend"]


def export_interface(array: Any, desc: dict[str, Any]) -> dict[str, Any]:
    """Order the consumer of ``array``'s ``__cuda_array_interface__`` (``desc``).

    The interface (version 3) names a stream its consumer synchronises with
    before using the data. That stream (the array's; for the default stream
    the legacy stream, named ``1``) is made to wait here for every use of the
    block the library knows of, whichever stream made it, and the export is
    recorded as a read-write use on it: later tracked uses wait for the
    work queued on it up to now. A consumer that keeps using the data on its
    own stream afterwards is outside the library: wrap that in :func:`lend`.

    Parameters
    ----------
    array : device array
        The exported array.
    desc : dict
        The interface Numba built for it.

    Returns
    -------
    dict
        ``desc`` with the stream its consumer must synchronise with.
    """
    rt = target.runtime()
    kind, block, _ = target.resolve(rt, array)
    if kind != target.DEVICE or block is None or not is_tracking(rt):
        return desc
    named = desc.get("stream")
    order_export(block, 0 if named in (None, 1, 2) else int(named), "exported array",
                 target.array_span(block, array))
    if named is None:
        desc = dict(desc, stream=1)  # the legacy default stream, which was ordered
    return desc


@contextlib.contextmanager
def lend(array: Any, *, stream: Any, access: Access | str = "rw") -> Iterator[Any]:
    """Lend ``array`` to work the library does not see, queued on ``stream``
    (a PyTorch, CuPy, cuda.core or Numba stream, or a handle) inside the block.

    On entry ``stream`` waits for the array's earlier uses that ``access``
    conflicts with; on exit the array's later tracked uses are ordered after
    everything queued on ``stream`` by then (recorded as a use of ``access``
    there). The stream object is kept alive while that use is recorded.

    Parameters
    ----------
    array : device array
        An array of the library (views included).
    stream : stream-like
        The foreign stream the borrowed work runs on.
    access : Access or str
        What the foreign work does: ``"r"``, ``"w"`` or ``"rw"`` (default).

    Yields
    ------
    The array.

    Raises
    ------
    InvalidArgument
        ``array`` is not an array of the library, or ``access`` names no access.
    """
    access = as_access(access)
    rt = target.runtime()
    block = device_block(rt, array, "lend: array")
    if block is None:
        raise InvalidArgument("lend: the array was not allocated by numba_streamsafe; only "
                              "its arrays have uses to order")
    if block.device != rt.device:
        rt = get_runtime(block.device)
    handle, owner = rt.stream_ref(stream)
    uses = single(block, access, "lent array", False, target.array_span(block, array))
    with rt.activate():
        preflight(rt, handle, uses, False, owner)
    try:
        yield array
    finally:
        with rt.activate():
            commit(rt, handle, uses, owner)
