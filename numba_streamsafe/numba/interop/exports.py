"""Ordering a consumer the library does not see after a block's known uses.

The array interface's and DLPack's exports both run :func:`order_export`;
this module holds it so that neither export module depends on the other.
"""

from __future__ import annotations

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block
from numba_streamsafe.numba import target
from numba_streamsafe.numba.launch.policy import launch_policy
from numba_streamsafe.protocol import commit, preflight, single
from numba_streamsafe.runtime import get_runtime

__all__ = ["order_export"]


def order_export(block: Block, handle: int, what: str,
                 span: tuple[int, int] | None = None) -> None:
    """Make the consumer's stream ``handle`` wait for every known use of the
    bytes ``span`` of ``block`` (all of it by default: the exported array's
    extent) and record the export there as a read-write use of them (the
    array interface's and DLPack's exports; nothing with tracking off).

    The consumer's stream is known by its handle only: its mark's event is
    recorded at once, while the stream surely exists (its owner may destroy
    it at any time, and a late record on a destroyed stream would fail).
    """
    rt = target.runtime()
    if block.device != rt.device:
        rt = get_runtime(block.device)
    if not launch_policy(rt).tracking:
        return
    uses = single(block, Access.READ_WRITE, what, False, span)
    with rt.activate():
        preflight(rt, handle, uses, False)
        commit(rt, handle, uses)
        seal = getattr(rt.resource.tracker, "seal_open", None)
        if seal is not None:
            seal(handle)
