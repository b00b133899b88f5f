"""A race as the reports give it, and the one way it is written out.

A :class:`Hazard` is two conflicting accesses of which neither is ordered
after the other; each is a :class:`Side`: the kernel or copy, the argument,
the stream, the user's stack where it was queued (a
:data:`~numba_streamsafe.core.sites.Stack`), who queued it, and who made its
stream (a :class:`~numba_streamsafe.core.streams.StreamOrigin`). The
simulator's checker, check mode and the ordering-mode race check all make
them, and all write them out the same way:

* ``str(hazard)``: one line, both sides at their innermost line;
* :meth:`Hazard.report`: the full report, with both stacks, where the memory
  was allocated (and freed), each stream's creator and a fix written for
  the program's kind;
* :meth:`Hazard.record`: the same as one JSON object (the machine-readable
  report, ``NUMBA_STREAMSAFE_REPORT_FILE``).

Stacks are kept as plain ``(file, line)`` pairs; the text, the source lines
and the fix are made here, only when a race is reported.
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field
from typing import Any

from numba_streamsafe.core.sites import Stack, resolve_stack
from numba_streamsafe.core.streams import StreamOrigin, stream_origin

__all__ = ["Hazard", "Side", "NUMBA", "TRACKED", "FREE", "site_text"]

#: Who queued a work (:attr:`Side.library`): plain Numba (transparent mode's
#: plain kernels, Numba's copies and fills), whose fix is an event.
NUMBA = "numba"
#: This library's own work (tracked kernels, tracked copies and fills,
#: ``LaunchRecorder``), whose fix is an annotation or a tracked copy.
TRACKED = "numba_streamsafe"
#: The label of a side that is the free of the memory.
FREE = "cuMemFreeAsync"

#: Per hazard kind, the access of its first and its second side.
_ACCESSES = {"read-after-write": ("write", "read"), "write-after-write": ("write", "write"),
             "write-after-read": ("read", "write"), "use-after-free": ("free", None)}

#: Stream handles with a name of their own.
_DEFAULT_STREAMS = {0: "the legacy default stream", 1: "the legacy default stream",
                    2: "the per-thread default stream"}


def site_text(stack: Stack | None) -> str | None:
    """``file:line`` of the innermost frame of ``stack`` (either form, see
    :func:`~numba_streamsafe.core.sites.resolve_stack`; None: no frame)."""
    if not stack:
        return None
    path, line = resolve_stack(stack[:2])[0]
    return f"{path}:{line}"


@dataclass(frozen=True)
class Side:
    """One access of a hazard.

    Attributes
    ----------
    label : str
        The kernel or copy (``"cuMemFreeAsync"``: the free of the memory).
    param : str or None
        The argument (None when not known).
    stream : int or None
        The stream handle (None: the host).
    stack : tuple of (str, int)
        ``(file, line)`` of the user's frames where it was queued, innermost
        first (empty when not known).
    library : str or None
        Who queued it: :data:`NUMBA` (plain Numba), :data:`TRACKED` (this
        library's tracked work), another library's name, or None (not known).
    origin : StreamOrigin or None
        Who made the stream; looked up by handle when the side is made.
    """

    label: str
    param: str | None
    stream: int | None
    stack: Stack = ()
    library: str | None = None
    origin: StreamOrigin | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # A stack the launch paths captured is resolved into pairs now (a race is
        # reported); the stream's origin is looked up while the handle is its.
        object.__setattr__(self, "stack", resolve_stack(self.stack))
        if self.origin is None and self.stream is not None:
            object.__setattr__(self, "origin", stream_origin(self.stream))

    @property
    def site(self) -> str | None:
        """``file:line`` of the user's call that queued it (its innermost frame)."""
        return site_text(self.stack)

    def __str__(self) -> str:
        what = f"{self.label!r}" + (f" argument {self.param!r}" if self.param else "")
        where = "the host" if self.stream is None else f"stream {self.stream:#x}"
        at = f" (called at {_shown_site(self.stack)})" if self.stack else ""
        return what + f" on {where}" + at


@dataclass(frozen=True)
class Hazard:
    """An unordered pair of conflicting accesses: ``earlier`` and ``later``
    describe them in words; ``first`` and ``second`` (when both are accesses
    the library saw queued) name the kernel or copy, argument, stream, the
    user's stack and who queued each. ``allocated`` and ``freed`` are the
    user's stacks where the memory was allocated and freed (empty when not
    known or not freed)."""

    kind: str
    address: int
    earlier: str
    later: str
    first: Side | None = None
    second: Side | None = None
    #: Bytes from ``address`` that both accesses touch (0: not known).
    nbytes: int = 0
    allocated: Stack = ()
    freed: Stack = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocated", resolve_stack(self.allocated))
        object.__setattr__(self, "freed", resolve_stack(self.freed))

    def __str__(self) -> str:
        where = f"{self.address:#x}" + (f" (+{self.nbytes} B)" if self.nbytes else "")
        if self.first is not None and self.second is not None:
            return f"{self.kind} at {where}: {self.first} is not ordered before {self.second}"
        return f"{self.kind} at {where}: {self.earlier} is not ordered before {self.later}"

    def report(self) -> str:
        """The full report: the pair, both stacks (with their source lines),
        who made each stream, where the memory was allocated and freed, and
        the fix (:meth:`fix`)."""
        lines = [f"race: {self}"]
        first, second = self.first, self.second
        if first is not None and second is not None:
            a1, a2 = _ACCESSES.get(self.kind, (None, None))
            lines += _side_lines("first", a1, first, "")
            lines += _side_lines("second", a2, second, ", not ordered after the first")
            streams = _streams_line(first, second)
            if streams:
                lines.append(streams)
        if self.allocated:
            lines.append("  memory allocated at:")
            lines += _stack_lines(self.allocated)
        if self.freed and (second is None or second.label != FREE):
            lines.append("  memory freed at:")
            lines += _stack_lines(self.freed)
        fix = self.fix()
        if fix:
            lines.append("  fix: " + fix)
        return "\n".join(lines)

    def fix(self) -> str | None:
        """How to order the second side after the first, written for the
        program's kind: for plain Numba (or another library's work, or a
        free) an event recorded on the first side's stream after its line and
        waited for on the second side's stream before its line; for this
        library's tracked work, tracking turned on, the annotation or the
        tracked copy. None where the sides are not known."""
        first, second = self.first, self.second
        if first is None or second is None:
            return None
        libraries = {s.library for s in (first, second) if s.library}
        if libraries == {TRACKED} and second.label != FREE:
            return ("where tracking was off for this work (numba_streamsafe.tracking(False), "
                    "or NUMBA_STREAMSAFE_RESOURCE=direct), turn it on; else declare the "
                    "arguments' accesses as the kernels use them (a write declared Read is "
                    "waited for by no other stream), launch both on one stream, or use a "
                    "tracked copy (numba_streamsafe.copy); in ordering mode the library then "
                    "orders the two")
        if second.stream is None:
            before = _shown_site(second.stack) if second.stack else "it"
            return (f"wait for {_stream_name(first.stream)} before the host's access: "
                    f"before {before}, add `{_sync(first)}`")
        if first.stream is None:
            return None
        record, wait = _event_calls(second.library or first.library, first.stream,
                                    second.stream)
        after = (f"after {_shown_site(first.stack)}" if first.stack
                 else "after the first (its line is not known)")
        before = (f"before {_shown_site(second.stack)}" if second.stack
                  else "before the second (its line is not known)")
        what = "the free" if second.label == FREE else "the second"
        return (f"make {_stream_name(second.stream)} wait for {_stream_name(first.stream)} "
                f"between the two with an event:\n"
                f"      {after}, add:   {record}\n"
                f"      {before} ({what}), add:   {wait}")

    def record(self) -> dict[str, Any]:
        """The hazard as one JSON object: ``kind``, ``address``, ``nbytes``,
        ``first`` and ``second`` (each ``label``, ``param``, ``access``,
        ``stream``, ``library``, ``stack`` as ``[file, line]`` pairs, and
        ``stream_origin``: ``library``, ``how``, ``stack``), ``allocated``,
        ``freed``, ``fix`` and ``report`` (the text of :meth:`report`)."""
        a1, a2 = _ACCESSES.get(self.kind, (None, None))
        return {
            "kind": self.kind, "address": self.address, "nbytes": self.nbytes,
            "first": _side_record(self.first, a1, self.earlier),
            "second": _side_record(self.second, a2, self.later),
            "allocated": _stack_record(self.allocated), "freed": _stack_record(self.freed),
            "fix": self.fix(), "report": self.report(),
        }


# --------------------------------------------------------------- formatting
def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if rel.startswith(os.pardir) else rel


def _stack_lines(stack: Stack) -> list[str]:
    """One line per frame: ``file:line`` and its source line where readable
    (a frame at the line of the one before it, a comprehension's, is shown once)."""
    out = []
    for i, (path, line) in enumerate(stack):
        if i and stack[i - 1] == (path, line):
            continue
        source = linecache.getline(path, line).strip()
        where = f"{_shown(path)}:{line}"
        out.append(f"      {where}" + (f"   {source}" if source else ""))
    return out


def _stream_name(stream: int | None) -> str:
    if stream is None:
        return "the host"
    return f"stream {stream:#x}"


def _side_lines(which: str, access: str | None, side: Side, after: str) -> list[str]:
    does = f" ({access})" if access and side.label != FREE else ""
    what = "the free of the memory" if side.label == FREE else repr(side.label)
    if side.param:
        what += f" argument {side.param!r}"
    by = f", queued by {side.library}" if side.library else ""
    head = f"  {which}{does}: {what} on {_stream_name(side.stream)}{by}{after}"
    if not side.stack:
        return [head + " (where it was queued is not known)"]
    return [head + ", at:", *_stack_lines(side.stack)]


def _origin_text(stream: int | None, origin: StreamOrigin | None) -> str:
    if stream is None:
        return "the host"
    name = _DEFAULT_STREAMS.get(stream)
    if name is not None:
        return f"{stream:#x} is {name}"
    if origin is None:
        return f"{stream:#x}: who made it is not known"
    lib = f"by {origin.library}" if origin.library else "outside what was seen"
    site = site_text(origin.stack)
    at = f" at {_shown_site(origin.stack)}" if site else ""
    if origin.how == "made":
        return f"{stream:#x} made {lib}{at}"
    return f"{stream:#x} made {lib}, {origin.how}{at}"


def _shown_site(stack: Stack) -> str:
    return f"{_shown(stack[0][0])}:{stack[0][1]}"


def _streams_line(first: Side, second: Side) -> str | None:
    texts = [_origin_text(first.stream, first.origin)]
    if second.stream != first.stream:
        texts.append(_origin_text(second.stream, second.origin))
    texts = [t for t in texts if t != "the host"]
    return "  streams: " + "; ".join(texts) if texts else None


def _numba_stream(stream: int) -> str:
    if stream in (0, 1):
        return "cuda.legacy_default_stream()"
    if stream == 2:
        return "cuda.per_thread_default_stream()"
    return f"<stream {stream:#x}>"


def _event_calls(library: str | None, first: int, second: int) -> tuple[str, str]:
    """The record and the wait of an event, in ``library``'s calls."""
    s1, s2 = f"<stream {first:#x}>", f"<stream {second:#x}>"
    if library == "cupy":
        return f"ev = cupy.cuda.Event(); ev.record({s1})", f"{s2}.wait_event(ev)"
    if library == "torch":
        return f"ev = torch.cuda.Event(); ev.record({s1})", f"{s2}.wait_event(ev)"
    return (f"ev = cuda.event(); ev.record({_numba_stream(first)})",
            f"ev.wait({_numba_stream(second)})")


def _sync(side: Side) -> str:
    """The host's wait for ``side``'s stream (every library names it so)."""
    stream = side.stream if side.stream is not None else 0
    return f"<stream {stream:#x}>.synchronize()" if stream > 2 else "cuda.synchronize()"


def _stack_record(stack: Stack) -> list[list[Any]]:
    return [[path, line] for path, line in stack]


def _side_record(side: Side | None, access: str | None, words: str) -> dict[str, Any]:
    if side is None:
        return {"label": None, "param": None, "access": access, "stream": None,
                "library": None, "stack": [], "stream_origin": None, "text": words}
    origin = side.origin
    return {
        "label": side.label, "param": side.param, "access": access, "stream": side.stream,
        "library": side.library, "stack": _stack_record(side.stack),
        "stream_origin": None if origin is None else {
            "library": origin.library, "how": origin.how,
            "stack": _stack_record(origin.stack)},
        "text": str(side),
    }
