"""``@tracked_kernel``: Numba CUDA kernels whose launches order themselves;
and the plain ``cuda.jit`` kernels transparent mode orders, the same class of
another :class:`KernelKind`."""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
import typing
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numba import cuda

from numba_streamsafe._driver.limits import check_launch
from numba_streamsafe.core import hazards
from numba_streamsafe.core.access import Access, annotation_access, as_access
from numba_streamsafe.core.errors import (
    InvalidArgument,
    InvalidArgumentType,
    InvalidLaunchConfig,
    StreamMisuse,
)
from numba_streamsafe.core.modes import RecorderMode, recorder_mode
from numba_streamsafe.core.settings import settings
from numba_streamsafe.core.uses import PlainUses, Uses
from numba_streamsafe.numba import arrays, mlir, target
from numba_streamsafe.numba.accesses import access_check
from numba_streamsafe.numba.accesses.inference import infer_params
from numba_streamsafe.numba.launch import launch_plan, launcher
from numba_streamsafe.numba.launch.configured import ForAll, slow_launch
from numba_streamsafe.numba.launch.policy import launch_policy
from numba_streamsafe.numba.scope import FENCE, numba_call, per_thread, stream_scope
from numba_streamsafe.protocol import fenced
from numba_streamsafe.runtime import RUNTIMES

__all__ = ["tracked_kernel", "TrackedKernel", "KernelKind", "TRACKED", "PLAIN"]


#: How a declared access is written in a kernel's signature.
_ACCESS_NAMES = {Access.READ: "Read", Access.WRITE: "Write", Access.READ_WRITE: "ReadWrite"}


@dataclasses.dataclass(frozen=True)
class KernelKind:
    """What sets a kind of kernel apart; a :class:`TrackedKernel` holds one.

    Attributes
    ----------
    name : str
        How the kernel is shown (``repr``).
    declared : bool
        Accesses are declared (annotations, ``access=``; inferred where asked)
        and checked against the kernel's IR. Else every parameter's access
        comes from the IR at the first launch (read and written where the IR
        cannot be read): a plain kernel's.
    strict : bool
        Arrays that cannot be ordered are refused as the recorder mode says.
        Else nothing a plain launch accepts is refused: foreign arrays are
        ordered after the stream their interface names (or not at all), host
        arrays go through Numba's own transfers, and a launch Numba itself would
        refuse is handed to Numba to refuse.
    warns : bool
        A direct launch gives Numba's low-occupancy warning (a plain kernel's
        configuration gave it already).
    checks_config : bool
        A launch configuration is checked against the device's limits before
        the launch (:class:`~numba_streamsafe.core.errors.InvalidLaunchConfig`);
        else Numba checks it and the driver refuses the rest, with their errors.
    uploads_host : bool
        Host arrays of parameters with an access are copied to the device on
        the launch stream, tracked; else Numba transfers them.
    transparent : bool
        Fenced only while the thread's transparent mode fences
        (:func:`numba_streamsafe.transparent`).
    library : str
        Who the race reports say queued its launches (and whose fix they
        write): this library (a tracked kernel), or plain Numba.
    """

    name: str
    declared: bool
    strict: bool
    warns: bool
    checks_config: bool
    uploads_host: bool
    transparent: bool
    library: str


#: A ``@tracked_kernel``.
TRACKED = KernelKind("tracked_kernel", declared=True, strict=True, warns=True,
                     checks_config=True, uploads_host=True, transparent=False,
                     library=hazards.TRACKED)
#: A plain ``cuda.jit`` kernel under transparent mode. On a GPU Numba checks
#: the configuration; Numba's simulator checks nothing, so the library does.
PLAIN = KernelKind("plain kernel", declared=False, strict=False, warns=False,
                   checks_config=target.SIMULATOR, uploads_host=False, transparent=True,
                   library=hazards.NUMBA)


class TrackedKernel(launcher.Kernel):  # type: ignore[misc]
    """A Numba CUDA kernel whose every launch is fenced.

    Launch it as a Numba kernel: ``k[grid, block](*args)``,
    ``k[grid, block, stream](*args)``, ``k[grid, block, stream, shmem](*args)``
    or ``k.forall(n, stream=s)(*args)``. Each launch

    1. resolves every array argument to the block it lies in (views and
       slices included),
    2. queues on the launch stream the waits its declared accesses need
       (preflight),
    3. launches: directly (one ``cuLaunchKernel`` of the compiled overload,
       see :mod:`numba_streamsafe.numba.launch.launch_plan`) when the arguments are device
       arrays and scalars of an overload compiled before, otherwise through
       Numba, with allocations Numba makes for the launch (auto-transferred
       host inputs) ordered on the launch stream,
    4. records one event after the launch into every block (commit).

    Parameters
    ----------
    func : callable
        The kernel's Python function.
    access : mapping of str to Access or str, or "infer", optional
        Access per argument name; overrides annotations. A parameter with an
        access must be given an array at every launch: anything else (a
        scalar, None) is refused with
        :class:`~numba_streamsafe.core.errors.InvalidArgumentType` before anything
        is queued. ``"infer"``: every parameter without an annotation takes
        the access the kernel's IR shows (:mod:`numba_streamsafe.numba.accesses.inference`),
        decided at the first launch for the arguments that are arrays.
    check_access : bool, optional
        Check the declared accesses against the kernel's IR at its first
        launch (:mod:`numba_streamsafe.numba.accesses.access_check`): a parameter
        declared Read that the kernel writes raises
        :class:`~numba_streamsafe.core.errors.AccessMismatch`. Default: the
        ``NUMBA_STREAMSAFE_CHECK_ACCESS`` setting (on).
    mode : RecorderMode or str, optional
        ``"strict"`` (the runtime's default) refuses arrays the library did
        not allocate and array arguments with no declared access;
        ``"permissive"`` launches them unordered.
    allow_foreign : bool
        In strict mode, accept foreign ``__cuda_array_interface__`` arrays,
        ordered after their producer ``stream`` when they name one.
    **jit_options
        Passed to :func:`numba.cuda.jit`.
    """

    def __init__(self, func: Callable[..., Any], *,
                 access: Mapping[str, Any] | str | None = None,
                 mode: RecorderMode | str | None = None, allow_foreign: bool = False,
                 signature: Any = None, check_access: bool | None = None,
                 **jit_options: Any) -> None:
        name = getattr(func, "__name__", "kernel")
        infer = access == "infer"
        if isinstance(access, str) and not infer:
            raise InvalidArgument(f"{name}: access must be a mapping of parameter "
                                  f"names to accesses, or 'infer'; got {access!r}")
        if check_access is not None and not isinstance(check_access, bool):
            raise InvalidArgument(f"{name}: check_access is True, False or None, "
                                  f"got {check_access!r}")
        recorder = _kernel_mode(name, mode)  # refused before the kernel is compiled
        mlir.check_kernel(func)
        params = self._parse_access(func, access if isinstance(access, Mapping) else {})
        if signature is None:
            dispatcher = cuda.jit(**jit_options)(func)
        else:
            dispatcher = cuda.jit(signature, **jit_options)(func)
        self._setup(TRACKED, dispatcher, params, mode=recorder,
                    allow_foreign=allow_foreign, infer=infer,
                    check_access=check_access)

    @classmethod
    def plain(cls, dispatcher: Any, configure: Callable[[Any, Any], Any],
              fence: bool = True) -> TrackedKernel:
        """The kernel transparent mode launches for one of Numba's dispatchers
        (a ``CUDADispatcher`` on a GPU, a ``FakeCUDAKernel`` under Numba's CUDA
        simulator): of kind :data:`PLAIN`, its launches compiled through
        ``dispatcher`` and, where the direct launch does not cover them, made by
        ``configure(dispatcher, config)`` (Numba's own, unhooked
        ``__getitem__``). ``fence`` False: launches are only shown to a checking
        driver (transparent mode's setting).

        Raises
        ------
        InvalidArgument
            The kernel takes keyword-only or ``**`` parameters: transparent mode
            leaves such a kernel to Numba. A ``*args`` parameter is ordered as
            the tuple Numba packs the remaining arguments into.
        """
        params, star = _plain_parameters(dispatcher.py_func)
        kernel = cls.__new__(cls)
        kernel._setup(PLAIN, dispatcher, params, mode=RecorderMode.PERMISSIVE,
                      allow_foreign=True, infer=True, check_access=False, configure=configure,
                      fence=fence, star=star)
        return kernel

    def _setup(self, kind: KernelKind, dispatcher: Any,
               params: tuple[tuple[str, Access | None], ...], *, mode: RecorderMode | None,
               allow_foreign: bool, infer: bool, check_access: bool | None,
               configure: Callable[[Any, Any], Any] | None = None, fence: bool = True,
               star: bool = False) -> None:
        """Every field of a kernel, of either kind: the one place they are set."""
        func = dispatcher.py_func
        self.kind = kind
        self.py_func = func
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__doc__ = func.__doc__
        self.mode = mode
        self.allow_foreign = allow_foreign
        self.infer = infer
        self.check_access = check_access
        self.params = params
        #: Set at the first launch, once the accesses are checked (and inferred).
        self._access_ready = False
        #: The inferred access per parameter, read when a checking driver needs it.
        self._inferred: dict[str, Access | None] | None = None
        #: A plain kernel's every parameter's inferred access, whatever its
        #: first argument was.
        self._every: dict[str, Access | None] = {}
        #: Numba's configured launch for what the direct launch does not cover
        #: (None: ``dispatcher[config]``).
        self._numba_configure = configure
        self._fence = fence
        #: Whether the last parameter is ``*args`` (a plain kernel's).
        self._star = star
        self._bind(dispatcher)

    def check_config(self, grid: Any, block: Any, shmem: Any
                     ) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
        """``(grid, block, shmem)`` normalised, if the launch device accepts them.

        Raises
        ------
        InvalidLaunchConfig
            The device refuses them (the message names the kernel and the limit).
        """
        rt = target.launch_runtime()
        try:
            return check_launch(grid, block, shmem, rt.driver.launch_limits())
        except InvalidLaunchConfig as exc:
            raise InvalidLaunchConfig(f"kernel {self.__name__!r}: {exc}") from None

    def _bind(self, dispatcher: Any) -> None:
        """Launch through Numba's ``dispatcher``, with empty launch caches."""
        self.dispatcher = dispatcher
        #: The direct launches' plans (per device and argument types).
        self.direct = launch_plan.DirectLaunches()
        #: Grids Numba's low-occupancy warning was given for (direct launches).
        self.warned_grids: set[tuple[int, int, int]] = set()
        #: What the compiled launch path reads for this kernel on one runtime
        #: (:func:`~.configured.launch_state_for`), built after its first direct launch there.
        self.launch_state: launcher.LaunchState | None = None

    @staticmethod
    def _parse_access(func: Callable[..., Any], overrides: Mapping[str, Any]
                      ) -> tuple[tuple[str, Access | None], ...]:
        sig = inspect.signature(func)
        try:
            hints = typing.get_type_hints(func)
        except Exception:
            hints = {}
        names = list(sig.parameters)
        unknown = set(overrides) - set(names)
        if unknown:
            example = ", ".join(f"{n!r}: 'r'" for n in names[:2])
            raise InvalidArgument(
                f"{func.__name__}: access given for {sorted(unknown)}, which are not parameters "
                f"of the kernel ({', '.join(names)}). Name parameters of the kernel, e.g. "
                f"access={{{example}}} ('r', 'w' or 'rw'), or annotate them in its signature"
            )
        params = []
        for name, p in sig.parameters.items():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise InvalidArgument(
                    f"{func.__name__}: parameter {name!r} is {p.kind.description}; kernels take "
                    "positional parameters only"
                )
            if name in overrides:
                try:
                    access: Access | None = as_access(overrides[name])
                except ValueError as exc:
                    raise InvalidArgument(
                        f"{func.__name__}: access={{{name!r}: ...}}: {exc}"
                    ) from None
            else:
                access = annotation_access(hints.get(name, p.annotation))
            params.append((name, access))
        return tuple(params)

    @property
    def accesses(self) -> dict[str, Access | None]:
        """Declared access per parameter (None: not an array, or undeclared)."""
        return dict(self.params)

    # ------------------------------------------------------------------ launch
    def launch_python(self, launch: launcher.Launcher, args: tuple[Any, ...]) -> None:
        """A launch the direct launch handed back (:func:`~.configured.slow_launch`)."""
        slow_launch(self, launch.config, launch.stream, args)

    def forall(self, ntasks: int, tpb: int = 0, stream: Any = 0, sharedmem: int = 0) -> ForAll:
        """A 1-D launch over ``ntasks`` threads, as :meth:`numba.cuda.Dispatcher.forall`."""
        return ForAll(self, ntasks, tpb, stream, sharedmem)

    def __call__(self, *args: Any) -> None:
        raise StreamMisuse(
            f"kernel {self.__name__!r} needs a launch configuration: "
            f"{self.__name__}[grid, block, stream](...)"
        )

    def __repr__(self) -> str:
        if not self.kind.declared:
            return f"<{self.kind.name} {self.__name__} (transparent mode)>"
        decl = ", ".join(f"{n}: {a.name if a else '-'}" for n, a in self.params)
        return f"<{self.kind.name} {self.__name__}({decl})>"

    def _arguments(self, rt: Any, args: tuple[Any, ...], stream: Any, strict: bool,
                   traced: bool) -> tuple[tuple[Any, ...], Uses, bool]:
        """Resolve the arguments of one launch, once: every array an argument
        passes (the arrays inside a tuple too, named ``name[i]``, each with the
        tuple's access) to the block it lies in and the bytes it spans.

        Returns
        -------
        (args, uses, host)
            The arguments to launch (host arrays of parameters with an access
            uploaded on ``stream``, for a kind that uploads), their uses (with
            what the kernel really touches when ``traced``: a checking driver
            is told the union of the declared and the inferred accesses, so an
            undeclared write shows as a hazard), and whether a host array is
            left for Numba to transfer.

        Raises
        ------
        InvalidArgument, InvalidArgumentType, StreamMisuse
            An argument the kind refuses (the wrong number of them, an array
            with no access in strict mode, a non-array declared an array, a host
            array declared written); nothing is queued.
        """
        params = self.params
        if len(args) != len(params):
            raise InvalidArgument(
                f"{self.__name__} takes {len(params)} arguments ({', '.join(n for n, _ in params)})"
                f", got {len(args)}"
            )
        if traced and self._inferred is None:
            self._inferred = access_check.inferred(self.py_func)
        uses, host, seen = self._resolve(rt, self._arrays_passed(args), strict, traced)
        if host and self.kind.uploads_host:  # Read host arrays, uploaded on the launch stream
            args = self._upload_host(args, stream)
            uses, host, seen = self._resolve(rt, self._arrays_passed(args), strict, traced)
        if seen:
            self._tell_actual(uses, seen)
        return args, uses, host

    def _arrays_passed(self, args: tuple[Any, ...]) -> list[tuple[str, str, Access | None, Any]]:
        """Every array ``args`` pass, in order, as ``(parameter, name, access,
        array)``: the arrays inside a tuple argument too (namedtuples and nested
        tuples), named ``name[i]``, with the tuple's access; other arguments as
        they are. A plain kernel's parameter that held no array at the first
        launch takes its inferred access; its tuples with no access are left out."""
        kind = self.kind
        every = self._every
        flat: list[tuple[str, str, Access | None, Any]] = []
        for (name, access), arg in zip(self.params, args, strict=True):
            if access is None and not kind.declared:
                access = every.get(name)
            if not isinstance(arg, tuple):
                flat.append((name, name, access, arg))
                continue
            if not kind.strict and access is None:
                continue
            pending: list[tuple[str, Any]] = [(name, iter(enumerate(arg)))]
            while pending:
                shown, members = pending[-1]
                step = next(members, None)
                if step is None:
                    pending.pop()
                    continue
                i, member = step
                if isinstance(member, tuple):
                    pending.append((f"{shown}[{i}]", iter(enumerate(member))))
                elif access_check.is_array(member):
                    flat.append((name, f"{shown}[{i}]", access, member))
        return flat

    def _resolve(self, rt: Any, flat: list[tuple[str, str, Access | None, Any]], strict: bool,
                 traced: bool) -> tuple[Uses, bool, list[tuple[str, Any, int, int]]]:
        """The uses of the arrays passed (:meth:`_arrays_passed`), whether one is
        a host array Numba transfers, and (``traced``) every array over a block
        as ``(parameter, block, lo, hi)``; what the kind refuses raises."""
        kind = self.kind
        uses = PlainUses() if kind.library == hazards.NUMBA else Uses()
        seen: list[tuple[str, Any, int, int]] = []
        host = False
        for param, shown, access, arg in flat:
            gpu_data = getattr(arg, "gpu_data", None)
            block = getattr(gpu_data, "_nss_block", None) if gpu_data is not None else None
            if block is not None:  # an array over one of our blocks (GPU)
                where, producer = target.DEVICE, None
            else:
                where, block, producer = target.resolve(rt, arg)
            if where != target.DEVICE:
                host = self._other(where, shown, access, arg, strict) or host
                continue
            if block is None:
                self._untracked(uses, shown, access, arg, producer, strict)
                continue
            lo, hi = target.array_span(block, arg)
            if traced:
                seen.append((param, block, lo, hi))
            if access is not None:
                uses.add(block, access, shown, lo, hi)
            elif kind.strict and strict:
                raise self._no_access(shown)
        return uses, host, seen

    def _untracked(self, uses: Uses, name: str, access: Access | None, arg: Any,
                   producer: int | None, strict: bool) -> None:
        """The use of a device array over memory no resource tracks: after its
        producer stream, if it names one; untracked (refused in strict mode)
        unless the kind takes foreign arrays; nothing for an empty array (a
        null pointer in Numba: no bytes to order)."""
        kind = self.kind
        if access is None:
            if kind.strict and strict:
                raise self._no_access(name)
            return
        if kind.strict and getattr(arg, "size", None) == 0:
            return
        if producer is not None:
            uses.add_producer(producer)
        if kind.strict and not self.allow_foreign:
            uses.add(None, access, f"argument {name!r} of {self.__name__}")

    def _other(self, where: int, name: str, access: Access | None, arg: Any, strict: bool
               ) -> bool:
        """Whether an argument that is not a device array is a host array Numba
        transfers (raises what the kind refuses: a non-array declared an array,
        an array with no access in strict mode, a host array declared written)."""
        kind = self.kind
        if where == target.OTHER:
            if access is not None and kind.strict:
                raise self._not_an_array(name, access, arg)
            return False
        if not kind.strict:
            return True  # Numba transfers it, whatever the kernel does with it
        if access is None:
            if strict:
                raise self._no_access(name)
            return False
        if access & Access.WRITE:
            raise InvalidArgument(
                f"argument {name!r} of {self.__name__} is declared {access.name} but is "
                "a host array; Numba would copy it back synchronously. Pass a device "
                "array (numba_streamsafe.to_device(a, stream=...))"
            )
        return True  # auto-transferred on the launch stream, freed there

    def _tell_actual(self, uses: Uses, seen: list[tuple[str, Any, int, int]]) -> None:
        """For a checking driver: the spans of ``uses`` with the union of the
        declared and the inferred accesses (``seen``: every array over a block,
        with its parameter)."""
        inferred = self._inferred or {}
        actual = {(b.ptr + lo, hi - lo): a for b, a, lo, hi in uses.blocks}
        more = False
        for param, block, lo, hi in seen:
            extra = inferred.get(param)
            if extra is None:
                continue
            key = (block.ptr + lo, hi - lo)
            now = actual.get(key)
            if now is None or now | extra != now:
                actual[key] = extra if now is None else Access(now | extra)
                more = True
        if more:
            uses.actual = [(p, n, Access(a)) for (p, n), a in actual.items()]

    def _no_access(self, name: str) -> StreamMisuse:
        param = name.split("[", 1)[0]  # a tuple's array: its parameter's access
        return StreamMisuse(
            f"argument {name!r} of {self.__name__} is an array with no declared "
            f"access; annotate {param!r} (def {self.__name__}(..., {param}: Read | "
            "Write | ReadWrite, ...); the arrays of a tuple take its access) or pass "
            "access={...} to tracked_kernel"
        )

    def _not_an_array(self, name: str, access: Access, arg: Any) -> InvalidArgumentType:
        declared = _ACCESS_NAMES[access]
        return InvalidArgumentType(
            f"argument {name!r} of kernel {self.__name__!r} is declared {declared} but got "
            f"{type(arg).__name__} {reprlib.repr(arg)}, which is not an array. Pass a device array "
            "(numba_streamsafe.device_array or to_device), or, if the parameter is a scalar, "
            f"drop its access declaration ({name}: {declared})"
        )

    def _prepare_access(self, args: tuple[Any, ...]) -> None:
        """First launch: check the declared accesses, infer the others
        (``access="infer"``); raises before anything is queued. Of a kind with no
        declared accesses, every parameter's comes from the kernel's IR; where
        the IR cannot be read, every array is taken as read and written."""
        if not self.kind.declared:
            try:
                every = {u.name: u.access for u in infer_params(self.py_func)}
            except Exception:
                every = {name: Access.READ_WRITE for name, _ in self.params}
            self._every = every
            self._inferred = every
            self.params = tuple((name, every.get(name) if access_check.holds_arrays(arg)
                                 else None)
                                for (name, _), arg in zip(self.params, args, strict=True))
            self._access_ready = True
            return
        config = settings()
        check = self.check_access if self.check_access is not None else config.check_access
        if config.access == "infer":  # every parameter inferred, declarations set aside
            self.infer = True
            self.params = tuple((name, None) for name, _ in self.params)
        if (check or self.infer) and len(args) == len(self.params):
            self.params = access_check.prepare(self.__name__, self.py_func, self.params, args,
                                               infer=self.infer, check=check)
        if len(args) == len(self.params):
            self._access_ready = True

    def _upload_host(self, args: tuple[Any, ...], stream: Any) -> tuple[Any, ...]:
        """``args`` with each host (NumPy) argument of a parameter declared (or
        inferred) Read copied to a new device array on the launch ``stream``: a
        tracked copy, so it works on any stream (Numba's own transfer does
        not), and the copy's block is freed in stream order once the launch is
        done with it (a host argument declared written was refused before).
        Host arguments without an access are left as they are."""
        out = list(args)
        for i, ((name, access), arg) in enumerate(zip(self.params, args, strict=True)):
            if access is not None and isinstance(arg, np.ndarray):
                out[i] = arrays.to_device(arg, stream=stream, tag=f"{name} of {self.__name__}")
        return tuple(out)

    def run(self, stream: Any, args: tuple[Any, ...],
            dims: tuple[tuple[int, int, int], tuple[int, int, int], int] | None,
            numba_launch: Callable[[], Callable[..., Any]]) -> None:
        """One launch on the Python path: preflight, the launch (direct when
        ``dims`` is given and a plan applies, else ``numba_launch()(*args)``),
        commit. The arguments of a ``*args`` parameter are ordered as the tuple
        Numba packs them into, and launched as given; of a kind that refuses
        nothing, a launch Numba would refuse (the wrong number of arguments)
        goes to Numba to refuse."""
        if self._star:
            fixed = len(self.params) - 1
            if len(args) < fixed:
                numba_launch()(*args)  # Numba refuses it with its own error
                return

            def as_given() -> Callable[..., Any]:
                launch = numba_launch()
                return lambda *_: launch(*args)

            self._launch(stream, (*args[:fixed], tuple(args[fixed:])), None, as_given)
            return
        if not self.kind.strict and len(args) != len(self.params):
            numba_launch()(*args)  # Numba refuses it with its own error
            return
        self._launch(stream, args, dims, numba_launch)

    def _launch(self, stream: Any, args: tuple[Any, ...],
                dims: tuple[tuple[int, int, int], tuple[int, int, int], int] | None,
                numba_launch: Callable[[], Callable[..., Any]]) -> None:
        """:meth:`run` once the arguments are the parameters'. The kernel decides
        first (its accesses at the first launch, strictness, whether the launch
        is fenced) and resolves the arguments once (:meth:`_arguments`); the
        launch stream's handle comes next, and all of it is handed down: to the
        direct launch (:class:`~.launch_plan.DirectLaunches`) or, where that
        does not apply, to Numba's launch, fenced by the protocol."""
        if not self._access_ready:
            self._prepare_access(args)
        rt = RUNTIMES.sole
        if rt is None:  # several devices (or none yet): the current one's
            rt = target.launch_runtime()
        strict = (self.mode or rt.mode) is RecorderMode.STRICT
        args, uses, host = self._arguments(rt, args, stream, strict, rt.driver.traces_accesses)
        policy = launch_policy(rt)
        if self.kind.transparent:  # fenced only while the thread's transparent mode fences
            tracking = bool(policy.tracking and self._fence and per_thread.transparent == FENCE)
        else:
            tracking = policy.tracking
        handle, owner = rt.streams.ref(stream)
        if (dims is not None and not host and policy.direct_launch
                and self.direct.launch(self, rt, args, uses, dims, handle, owner, strict,
                                       tracking)):
            return
        # Numba's launch path: the copies and launches Numba makes inside it
        # (auto-transfers, a forall's specialised launch) are this launch's.
        launch = numba_call(numba_launch)
        if host:
            with stream_scope(stream):
                fenced(rt, handle, uses, self.__name__, strict, owner, numba_call, launch, *args,
                       tracking=tracking)
        else:
            fenced(rt, handle, uses, self.__name__, strict, owner, numba_call, launch, *args,
                   tracking=tracking)

    def configure(self, config: tuple[Any, ...]) -> Any:
        """Numba's configured launch of the dispatcher (``dispatcher[config]``,
        or Numba's own unhooked one for a kernel transparent mode made)."""
        if self._numba_configure is not None:
            return self._numba_configure(self.dispatcher, config)
        return self.dispatcher[config]


def tracked_kernel(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate a kernel so every launch waits for, and records, its buffers' uses.

    Declare each array argument's access in the signature
    (``def scale(src: Read, dst: Write, k)``) or with ``access=``
    (``@tracked_kernel(access={"src": "r", "dst": "w"}, fastmath=True)``).
    See :class:`TrackedKernel` for the options and the launch protocol.

    Parameters
    ----------
    func : function, optional
        The kernel's Python function (omitted when called with options).
    **options
        ``access`` (a dict of parameter name to ``"r"``, ``"w"``, ``"rw"`` or
        an :class:`Access`), ``mode`` (``"strict"`` or ``"permissive"``) and
        the options ``numba.cuda.jit`` takes.

    Returns
    -------
    TrackedKernel or callable
        The tracked kernel; with options only, a decorator that makes one.

    Raises
    ------
    InvalidArgument
        An unknown access name (the message names the fix), a ``mode`` other
        than ``"strict"`` or ``"permissive"`` (refused when the decorator is
        made), or a kernel written for numba-cuda-mlir (tracked kernels
        compile with numba-cuda).
    """
    if func is None:
        if options.get("mode") is not None:
            _kernel_mode("tracked_kernel", options["mode"])  # refused before the decorator
        return lambda f: TrackedKernel(f, **options)
    return TrackedKernel(func, **options)


def _kernel_mode(name: str, mode: RecorderMode | str | None) -> RecorderMode | None:
    """The kernel's ``mode=`` as a :class:`RecorderMode` (None: the runtime's).

    Raises
    ------
    InvalidArgument
        ``mode`` is not ``"strict"``, ``"permissive"`` or a :class:`RecorderMode`.
    """
    return None if mode is None else recorder_mode(mode, f"{name}: mode")


def _plain_parameters(func: Callable[..., Any]) -> tuple[tuple[tuple[str, None], ...], bool]:
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
