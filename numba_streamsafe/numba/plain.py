"""Plain ``cuda.jit`` kernels launched under the launch protocol.

A :class:`PlainKernel` stands beside one of Numba's dispatchers (a
``CUDADispatcher`` on a GPU, a ``FakeCUDAKernel`` under Numba's CUDA
simulator) when transparent mode is on (:mod:`numba_streamsafe.numba.transparent`).
It is a :class:`~numba_streamsafe.numba.launch.kernel.TrackedKernel` whose accesses
all come from the kernel's IR (:mod:`numba_streamsafe.numba.accesses.inference`:
over-approximate, never under) and which refuses nothing a plain launch
accepts: foreign arrays are ordered after the stream their interface names
(or not at all), host arrays go through Numba's own transfers, and a launch
Numba itself would refuse is handed to Numba to refuse.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.modes import RecorderMode
from numba_streamsafe.numba import target
from numba_streamsafe.numba.accesses.access_check import holds_arrays
from numba_streamsafe.numba.accesses.inference import infer_params
from numba_streamsafe.numba.launch.kernel import TrackedKernel
from numba_streamsafe.numba.scope import FENCE, per_thread
from numba_streamsafe.protocol import Uses

__all__ = ["PlainKernel"]


class PlainKernel(TrackedKernel):
    """A plain Numba kernel whose launches are fenced with inferred accesses.

    Parameters
    ----------
    dispatcher : numba.cuda.dispatcher.CUDADispatcher or the simulator's kernel
        The kernel as ``cuda.jit`` made it; launches still compile through it.
    configure : callable
        Numba's own ``dispatcher[config]`` (the unhooked ``__getitem__``):
        the launch path for what the direct launch does not cover.
    fence : bool
        Whether launches are fenced (transparent mode's setting); when False
        they are only shown to a checking driver.

    Raises
    ------
    InvalidArgument
        The kernel takes keyword-only or ``**`` parameters: transparent mode
        leaves such a kernel to Numba. A ``*args`` parameter is ordered as the
        tuple Numba packs the remaining arguments into.
    """

    _warns = False  # Numba's configuration warns (GPU); the simulator does not
    #: On a GPU Numba checks the configuration and the driver refuses the rest,
    #: with Numba's errors; Numba's simulator checks nothing, so the library does.
    _checks_config = target.SIMULATOR

    def __init__(self, dispatcher: Any, configure: Callable[[Any, Any], Any],
                 fence: bool = True) -> None:
        func = dispatcher.py_func
        self.py_func = func
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__doc__ = func.__doc__
        self.mode = RecorderMode.PERMISSIVE
        self.allow_foreign = True
        self.infer = True
        self.check_access = False
        self.params, self._star = _parameters(func)
        self._access_ready = False
        self._inferred = None
        #: Every parameter's inferred access, whatever its first argument was.
        self._every: dict[str, Access | None] = {}
        self._numba_configure = configure
        self._fence = fence
        self._bind(dispatcher)

    def __repr__(self) -> str:
        return f"<plain kernel {self.__name__} (transparent mode)>"

    def _prepare_access(self, args: tuple[Any, ...]) -> None:
        """First launch: every parameter's access from the kernel's IR; where the
        IR cannot be read, every array is taken as read and written."""
        try:
            every = {u.name: u.access for u in infer_params(self.py_func)}
        except Exception:
            every = {name: Access.READ_WRITE for name, _ in self.params}
        self._every = every
        self._inferred = every
        self.params = tuple((name, every.get(name) if holds_arrays(arg) else None)
                            for (name, _), arg in zip(self.params, args, strict=True))
        self._access_ready = True

    def _launch(self, stream: Any, args: tuple[Any, ...],
                dims: tuple[tuple[int, int, int], tuple[int, int, int], int] | None,
                numba_launch: Callable[[], Callable[..., Any]]) -> None:
        if self._star:
            # Numba packs the arguments past the fixed ones into a tuple for the
            # ``*args`` parameter: ordered as that tuple, launched as given.
            fixed = len(self.params) - 1
            if len(args) < fixed:
                numba_launch()(*args)  # Numba refuses it with its own error
                return

            def as_given() -> Callable[..., Any]:
                launch = numba_launch()
                return lambda *_: launch(*args)

            super()._launch(stream, (*args[:fixed], tuple(args[fixed:])), None, as_given)
            return
        if len(args) != len(self.params):
            numba_launch()(*args)  # Numba refuses it with its own error
            return
        super()._launch(stream, args, dims, numba_launch)

    def _resolve(self, rt: Any, uses: Uses, name: str, access: Access | None, arg: Any
                 ) -> bool:
        """The use of an argument that is not an array over one of the library's
        blocks with an access: ordered where it can be, refused never. The
        arrays inside a tuple are each used with the tuple's access."""
        if isinstance(arg, tuple):
            if access is None:  # a parameter that held no array at the first launch
                access = self._every.get(name)
                if access is None:
                    return False
            return self._resolve_tuple(rt, uses, name, access, arg)
        kind, block, producer = target.resolve(rt, arg)
        if kind != target.DEVICE:
            return kind == target.HOST  # host arrays: Numba's transfers, on the launch stream
        if access is None:  # a parameter that was no array at the first launch
            access = self._every.get(name)
            if access is None:
                return False
        if block is None:
            if producer is not None:
                uses.add_producer(producer)
            return False
        uses.add(block, access, name, *target.array_span(block, arg))
        return False

    def _upload_host(self, args: tuple[Any, ...], stream: Any) -> tuple[tuple[Any, ...], bool]:
        return args, False  # Numba transfers host arrays, as a plain launch does

    def _tracking(self, policy: Any) -> bool:
        return bool(policy.tracking and self._fence and per_thread.transparent == FENCE)

    def _configure(self, config: tuple[Any, ...]) -> Any:
        return self._numba_configure(self.dispatcher, config)


def _parameters(func: Callable[..., Any]) -> tuple[tuple[tuple[str, None], ...], bool]:
    """A plain kernel's parameters (their accesses come at the first launch),
    and whether the last one is ``*args``.

    Raises
    ------
    InvalidArgument
        A keyword-only or ``**`` parameter: transparent mode leaves the kernel
        to Numba.
    """
    params = []
    star = False
    for name, p in inspect.signature(func).parameters.items():
        if p.kind is p.VAR_POSITIONAL:
            star = True
        elif p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or star:
            raise InvalidArgument(
                f"{getattr(func, '__name__', 'kernel')}: parameter {name!r} is "
                f"{p.kind.description}; transparent mode orders kernels of positional "
                "parameters and *args")
        params.append((name, None))
    return tuple(params), star
