"""The parts AsyncResource is composed of, each on its own: KeptBlocks,
PendingFrees, BlockTable and MarkBook (over the simulated driver)."""

from __future__ import annotations

import pytest

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block, next_generation
from numba_streamsafe.core.errors import StaleContext, UseAfterFree
from numba_streamsafe.resources.tracking.block_table import BlockTable
from numba_streamsafe.resources.tracking.freed import KeptBlocks, PendingFrees
from numba_streamsafe.resources.tracking.marks import EventPool, MarkBook
from numba_streamsafe.resources.tracking.rules import commit_locked, preflight_locked, resolve


def test_kept_blocks_take_what_was_put_on_the_same_stream_and_size():
    kept = KeptBlocks(limit=1000)
    owner = object()
    kept.put(5, 100, 0xA00, owner)
    kept.put(5, 100, 0xB00, None)
    assert kept.nbytes == 200 and kept.per_stream() == {5: 200}
    assert kept.take(5, 200) is None and kept.take(6, 100) is None
    assert kept.take(5, 100) == 0xB00  # newest first
    assert kept.owners == {5: owner}
    assert kept.take(5, 100) == 0xA00 and not kept and kept.nbytes == 0


def test_kept_blocks_free_the_oldest_first_and_count_them_pending():
    kept, pending, freed = KeptBlocks(limit=1000), PendingFrees(), []
    for stream, ptr in ((1, 0x100), (2, 0x200), (3, 0x300)):
        kept.put(stream, 100, ptr, f"owner{stream}")
    kept.free_oldest(150, lambda ptr, s: freed.append((ptr, s)), pending)
    assert freed == [(0x100, 1), (0x200, 2)]
    assert kept.nbytes == 100 and pending.nbytes == 200
    assert pending.per_stream() == {1: 100, 2: 100} and set(kept.owners) == {3}
    kept.free_stream(3, lambda ptr, s: freed.append((ptr, s)), pending)
    assert not kept and kept.owners == {} and pending.nbytes == 300


def test_kept_blocks_keep_what_a_failing_free_did_not_free():
    kept, pending = KeptBlocks(limit=1000), PendingFrees()
    kept.put(1, 100, 0x100, None)
    kept.put(1, 100, 0x200, None)

    def fail(ptr, stream):
        raise RuntimeError("driver")

    with pytest.raises(RuntimeError):
        kept.free_oldest(0, fail, pending)
    assert kept.nbytes == 200 and pending.nbytes == 0


def test_pending_frees_take_put_back_and_release():
    pending = PendingFrees()
    owner = object()
    pending.add(1, 100, None)
    pending.add(1, 50, owner)
    pending.add(2, 10, None)
    slots = pending.slots
    taken = pending.take_all()
    assert pending.slots is slots and slots == {}, "emptied in place (the resource aliases it)"
    assert taken == {1: [150, owner, None], 2: [10, None, None]} and pending.nbytes == 160
    pending.put_back(list(taken.items())[1:])
    assert pending.per_stream() == {2: 10}
    pending.release(150)
    pending.release_stream(2)
    assert pending.nbytes == 0 and not pending


def _block(ptr: int, stream: int = 0, epoch: int = 0, device: int = 0) -> Block:
    return Block(ptr, 256, device, stream, "b", next_generation(), epoch)


def test_block_table_validates_handles_and_finds_addresses():
    sim = SimDriver(backing=False)
    marks = MarkBook(sim, EventPool(sim))
    table = BlockTable(device=0)
    a = _block(0x1000)
    table.add(a, marks.current(0), marks)
    assert table.find(0x10FF) is a and table.find(0x1100) is None and table.find(0xFFF) is None
    assert table.entry(a, "use").block is a
    with pytest.raises(UseAfterFree):
        table.entry(_block(0x1000), "use")  # same address, another generation
    with pytest.raises(StaleContext):
        table.entry(_block(0x1000, epoch=1), "use")
    entries = table.clear()
    assert [e.block for e in entries] == [a] and table.epoch == 1 and table.live_bytes == 0


def test_block_table_owns_its_figures_through_its_calls():
    """add, replace and remove keep the table's byte and block figures, its
    index and the marks' uses; a borrowed block counts in no byte figure."""
    sim = SimDriver(backing=False)
    marks = MarkBook(sim, EventPool(sim))
    table = BlockTable(device=0)
    ready = marks.current(0)
    a = _block(0x1000)
    lent = Block(0x2000, 64, 0, 0, "lent", next_generation(), 0, borrowed=True)
    ea, el = table.add(a, ready, marks), table.add(lent, ready, marks)
    assert ready.refs == 2 and table.live_bytes == 256 and table.borrowed == 1
    assert table.blocks == 1 and table.find(0x2010) is lent
    again = _block(0x1000)  # the address allocated again, at once
    ea2 = table.replace(ea, again, ready, marks)
    assert ea.gone and not ea2.gone and table.entry(again, "use") is ea2
    assert ready.refs == 3 and table.live_bytes == 256 and table.find(0x1010) is again
    with pytest.raises(UseAfterFree):
        table.entry(a, "use")
    table.remove(el)
    assert el.gone and table.borrowed == 0 and table.find(0x2010) is None
    table.remove(ea2)
    assert table.live_bytes == 0 and table.blocks == 0 and not table.live


def test_block_table_forgets_a_retired_stream():
    sim = SimDriver(backing=False)
    marks = MarkBook(sim, EventPool(sim))
    table = BlockTable(device=0)
    a = _block(0x1000, stream=0)
    table.add(a, marks.current(7), marks)
    entry = table.entry(a, "use")
    entry.reads[9] = marks.current(9)
    entry.last_write.waiters = {9: None, 11: None}
    table.forget_stream(9)
    assert 9 not in entry.reads and entry.last_write.waiting() == {11: None}
    table.forget_stream(7)
    assert entry.last_write.stream < 0
    assert entry.waits_for(7, Access.READ) == [entry.last_write]  # a new stream 7 waits


def test_mark_book_seals_once_waits_once_and_releases_its_event():
    sim = SimDriver(backing=False)
    a, b = sim.create_stream(), sim.create_stream()
    pool = EventPool(sim)
    marks = MarkBook(sim, pool)
    mark = marks.current(a)
    marks.hold_sealed(mark)
    marks.wait_all(b, [mark])
    marks.wait_all(b, [mark])
    assert sim.calls["cuEventRecord"] == 1 and sim.calls["cuStreamWaitEvent"] == 1
    assert marks.current(a) is not mark, "a sealed mark is no longer open"
    marks.release(mark)
    assert mark.handle is None and mark.waiting() == {} and pool.in_use == 0


def test_a_mark_keeps_its_first_waiter_in_itself_and_the_others_in_a_dict():
    """Each waiting stream waits once, keeps the owner it gave (a None owner
    is replaced by a later one), and leaves the waiters when its history
    ends, whether it was the first (kept in the mark) or a later one."""
    sim = SimDriver(backing=False)
    a, b, c = (sim.create_stream() for _ in range(3))
    marks = MarkBook(sim, EventPool(sim))
    table = BlockTable(device=0)
    mark = table.add(_block(0x1000, stream=a), marks.current(a), marks).last_write
    owner_b, owner_c = object(), object()
    marks.wait_all(b, [mark])
    assert mark.waiting() == {b: None} and mark.waiters is None
    marks.wait_all(b, [mark], owner_b)
    assert sim.calls["cuStreamWaitEvent"] == 1 and mark.waiting() == {b: owner_b}
    marks.wait_all(c, [mark], owner_c)
    marks.wait_all(c, [mark])
    assert sim.calls["cuStreamWaitEvent"] == 2
    assert mark.waiting() == {b: owner_b, c: owner_c} and mark.waiters == {c: owner_c}
    table.forget_stream(b)
    assert mark.waiting() == {c: owner_c}
    marks.wait_all(b, [mark])  # the first place is free again: b is a new stream there
    assert sim.calls["cuStreamWaitEvent"] == 3 and mark.waiting() == {b: None, c: owner_c}
    table.forget_stream(c)
    marks.wait_all(b, [mark])
    assert sim.calls["cuStreamWaitEvent"] == 3 and mark.waiting() == {b: None}


def test_a_block_keeps_a_stream_s_read_in_place_and_drops_complete_reads_once_work_completes():
    """A stream that read the block before takes its place again. Once the
    host saw work complete, the next read of the block, by any stream, first
    drops every read the host saw complete (not only the oldest), whose
    marks' uses end; while nothing completes, nothing is scanned. A last
    write that a device synchronise saw complete is waited for by no stream,
    one that waited for it before included (counted as skipped, and the
    streams that waited are let go)."""
    sim = SimDriver(backing=False)
    s = [sim.create_stream() for _ in range(5)]
    book = MarkBook(sim, EventPool(sim))
    table = BlockTable(device=0)
    blk = _block(0x1000, stream=s[0])
    entry = table.add(blk, book.current(s[0]), book)

    def use(stream: int, access: Access = Access.READ) -> None:
        entries = resolve(table, [(blk, access)], "use")
        preflight_locked(book, entries, stream, None)
        commit_locked(book, entries, stream, None, True)  # sealed: a later use gets a new mark

    for k in (1, 2, 3, 1):
        use(s[k])
    assert list(entry.reads) == [s[1], s[2], s[3]]
    first, third = entry.reads[s[1]], entry.reads[s[3]]
    book.program_completed({s[1]: first.seq})  # the host saw s1's and s3's reads complete
    book.program_completed({s[3]: third.seq})
    use(s[2])  # a stream that read before: the complete reads go, wherever they stand
    assert list(entry.reads) == [s[2]] and not book.in_use(first) and not book.in_use(third)
    use(s[4])
    use(s[2])
    assert list(entry.reads) == [s[2], s[4]]

    use(s[0], Access.WRITE)
    last = entry.last_write
    waits = sim.calls["cuStreamWaitEvent"]
    use(s[1])
    assert sim.calls["cuStreamWaitEvent"] == waits + 1 and last.waiting() == {s[1]: None}
    book.program_completed_all(last.seq)  # a device synchronise
    skipped = book.skipped
    use(s[1])  # waited for it before: still skipped, and let go
    assert sim.calls["cuStreamWaitEvent"] == waits + 1 and book.skipped == skipped + 1
    assert last.waiting() == {}


def test_event_pool_reuses_the_newest_idle_handle_and_keeps_at_most_max_idle():
    """The pool is a stack of idle handles: an acquire takes the one released
    last, a release past ``max_idle`` destroys the handle, and ``forget``
    destroys exactly the idle ones (never one in use)."""
    sim = SimDriver(backing=False)
    pool = EventPool(sim, max_idle=2)
    made = [pool.acquire() for _ in range(3)]
    assert len(set(made)) == 3 and pool.in_use == 3 and pool.idle == 0
    assert sim.live_events == 3
    for h in made:
        pool.release(h)
    assert pool.idle == 2 and pool.in_use == 0 and sim.live_events == 2  # the third destroyed
    assert pool.acquire() == made[1] and pool.acquire() == made[0]  # newest first
    assert pool.idle == 0 and sim.live_events == 2
    fresh = pool.acquire()  # none idle: a new one
    assert fresh not in made[:2] and pool.in_use == 3 and sim.live_events == 3
    pool.release(made[0])
    pool.forget()  # the idle one is destroyed; the two in use are forgotten
    assert pool.idle == 0 and pool.in_use == 0 and sim.live_events == 2
    pool.release(fresh)  # made before the forget (its context reset): dropped, not pooled
    assert pool.idle == 0 and pool.in_use == 0
    assert pool.acquire() not in made + [fresh] and pool.in_use == 1


# ------------------------------------------------------------ an entry's end
class Owner:
    """Stands for a stream's owning object."""


def _entry(res, block):
    entry = res.table.live.get(block.ptr)
    assert entry is not None and entry.block is block and not entry.gone
    return entry


def test_an_entry_is_gone_whichever_way_its_block_leaves_the_table(sim, res):
    """The compiled launch keeps a block's entry on the array and trusts it
    while it is not ``gone``: every way out of the table must set it."""
    s = sim.create_stream()
    freed = _entry(res, a := res.allocate(4096, s, "freed"))
    res.deallocate(a)
    kept = _entry(res, b := res.allocate(4096, s, "kept"))  # the freed block was kept
    res.deallocate(b)
    owner = Owner()
    recycled = _entry(res, c := res.allocate(4096, s, "recycled", stream_owner=owner))
    res.defer_free(c)
    d = res.allocate(4096, s, "recycler", stream_owner=owner)  # the fused cycle
    assert d.ptr == c.ptr and res.stats().allocations == 4
    borrowed = _entry(res, e := res.borrow(0x7F00_0000_0000, 4096, s, "borrowed"))
    res.deallocate(e)
    cleared = _entry(res, d)
    assert all(x.gone for x in (freed, kept, recycled, borrowed))
    assert not cleared.gone
    res.reset_context()  # the table is cleared
    assert cleared.gone
