"""Direct launches: a tracked kernel's compiled overload launched with one
``cuLaunchKernel``, its parameters packed in one ``struct`` call.

Numba's launch path re-derives per launch what is fixed per overload (the
argument types, the marshalling of each argument, a ``cuda.core`` stream and
launch configuration) and costs tens of microseconds of host time. A tracked
kernel already walks its arguments to fence them, so it caches, per tuple of
argument types, a :class:`LaunchPlan`: the overload's function handle and the
layout of its flattened parameters, which are the ones Numba passes (for an
array: meminfo, parent, size, itemsize, data pointer, shape, strides in bytes;
for a scalar: its value at the kernel's type; complex numbers as two
parameters).

The direct path covers device arrays and scalars (integers, floats,
booleans, complex) of kernels that are not compiled with ``debug``, not
cooperative, not launch-configuration sensitive and have no argument
extensions. Everything else, the first launch of each argument-type tuple
(which compiles) and launches Numba would warn about, go through Numba's own
launch, so behaviour never depends on which path ran.
"""

from __future__ import annotations

import struct
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
from numba.cuda import types as _numba_types
from numba.cuda.np import numpy_support

from numba_streamsafe._driver.limits import normalize_dims
from numba_streamsafe.core.uses import Uses
from numba_streamsafe.numba import program_order, target
from numba_streamsafe.numba.accesses import access_check
from numba_streamsafe.numba.launch import launcher, packing
from numba_streamsafe.numba.launch.policy import launch_policy
from numba_streamsafe.protocol import fenced

if TYPE_CHECKING:
    from numba_streamsafe.numba.launch.kernel import TrackedKernel

types: Any = _numba_types  # Numba's type objects (untyped for checkers)

__all__ = ["PY_SCALARS", "LaunchPlan", "DirectLaunches", "argtypes_of", "build_plan",
           "param_slots", "normalize_dims", "launch_state_for", "warn_low_occupancy",
           "UNSUPPORTED"]

_ARRAY = 0
_SCALAR = 1
_COMPLEX = 2

# struct codes of the scalar types Numba passes by value.
_SCALAR_CODES: dict[Any, str] = {
    types.int8: "b", types.uint8: "B", types.int16: "h", types.uint16: "H",
    types.int32: "i", types.uint32: "I", types.int64: "q", types.uint64: "Q",
    types.float32: "f", types.float64: "d", types.boolean: "?",
}
_COMPLEX_CODES: dict[Any, str] = {types.complex64: "f", types.complex128: "d"}

# Numba types of Python scalars as kernel arguments (numba's typeof).
PY_SCALARS: dict[type, Any] = {int: types.int64, float: types.float64, bool: types.boolean,
                                complex: types.complex128}


def param_slots(argtypes: tuple[Any, ...]) -> tuple[list[str], list[int]] | None:
    """The flattened kernel parameters of an overload taking ``argtypes``.

    Returns
    -------
    (codes, kinds) or None
        One struct code per kernel parameter (``Q`` pointers, ``q`` sizes,
        shapes and strides, the scalar's own code otherwise), and one kind per
        argument; None when an argument type has no direct marshalling.
    """
    codes: list[str] = []
    kinds: list[int] = []
    for ty in argtypes:
        if isinstance(ty, types.Array):
            # meminfo, parent, nitems, itemsize, data, shape..., strides...
            codes += ["Q", "Q", "q", "q", "Q"] + ["q"] * (2 * ty.ndim)
            kinds.append(_ARRAY)
        elif ty in _SCALAR_CODES:
            codes.append(_SCALAR_CODES[ty])
            kinds.append(_SCALAR)
        elif ty in _COMPLEX_CODES:
            codes += [_COMPLEX_CODES[ty]] * 2
            kinds.append(_COMPLEX)
        else:
            return None
    return codes, kinds


def compiled_codes(argtypes: tuple[Any, ...]) -> bytes:
    """The parameter codes :func:`numba_streamsafe.numba.launch.packing.pack_into`
    packs by, for an overload whose parameters are ``argtypes`` (covered by
    :func:`param_slots`): one per argument, ``A`` for an array (its launch
    fields fill its parameters), ``C`` / ``Z`` for complex64 / complex128,
    otherwise the scalar's struct code."""
    out = []
    for ty in argtypes:
        if isinstance(ty, types.Array):
            out.append("A")
        elif ty in _COMPLEX_CODES:
            out.append("C" if _COMPLEX_CODES[ty] == "f" else "Z")
        else:
            out.append(_SCALAR_CODES[ty])
    return "".join(out).encode()


def array_fields(arg: Any) -> bytes:
    """The launch parameters of a device array as Numba passes them (meminfo,
    parent, size, itemsize, data pointer, shape, strides), 8 bytes each."""
    ndim = len(arg.shape)
    return struct.pack(f"=QQqqQ{2 * ndim}q", 0, 0, arg.size, arg.dtype.itemsize,
                       int(arg.gpu_data.device_pointer), *arg.shape, *arg.strides)


def cached_fields(arg: Any, argtype: Any) -> launcher.ArgFields | None:
    """The :class:`~numba_streamsafe.numba.launch.launcher.ArgFields` of a device array
    over a tracked block (a whole array or a view of one), cached on the
    array (a device array's pointer, shape and strides never change); None
    for an array over no tracked block."""
    fields = getattr(arg, "_nss_fast", None)
    if fields is None:
        gpu_data = getattr(arg, "gpu_data", None)
        block = getattr(gpu_data, "_nss_block", None)
        if block is None:  # a view: its pointer's owner holds the block
            block = getattr(getattr(gpu_data, "owner", None), "_nss_block", None)
            if block is None:
                return None
        fields = launcher.ArgFields(block, argtype, array_fields(arg),
                                    *target.array_span(block, arg))
        try:
            arg._nss_fast = fields
        except AttributeError:  # an array type that takes no attributes
            pass
    return fields  # type: ignore[no-any-return]


def _new_fields(arg: Any) -> launcher.ArgFields | None:
    """:func:`cached_fields` of a device array the compiled launch meets for
    the first time (``LaunchState.fields_of``), its Numba type as
    :func:`argtypes_of` gives it (so that a plan's argument types match it);
    None for anything else, or where the array's type cannot be read (the
    Python path then decides, and raises any error)."""
    if getattr(arg, "gpu_data", None) is None:
        return None
    try:
        return cached_fields(arg, _array_type(arg))
    except Exception:
        return None


class LaunchPlan:
    """How to launch one compiled overload directly: its function handle
    (``function``), Numba's per-device function cache of the overload's code
    library (``cache``) and the function it held when the plan was made
    (``cufunc``: while the cache still holds it, the module is loaded).

    Parameters
    ----------
    kernel : numba.cuda.dispatcher._Kernel
        The compiled overload.
    argtypes : tuple of numba types
        The overload's argument types, which fix the marshalling (covered by
        :func:`param_slots`).
    """

    __slots__ = ("kernel", "function", "cache", "cufunc", "kinds", "_scratch", "nparams",
                 "codes")

    def __init__(self, kernel: Any, argtypes: tuple[Any, ...]) -> None:
        slots = param_slots(argtypes)
        if slots is None:
            raise ValueError(f"no direct marshalling for {argtypes}")
        self.kernel = kernel
        cufunc = kernel._codelibrary.get_cufunc()
        self.cache = kernel._codelibrary._cufunc_cache
        self.cufunc = cufunc
        self.function = int(cufunc.handle)
        self.kinds = slots[1]
        #: One code per argument (:func:`compiled_codes`).
        self.codes = compiled_codes(argtypes)
        self.nparams = len(slots[0])
        self._scratch = packing.ParamScratch(self.nparams)

    def current(self, device_id: int) -> bool:
        """Whether the overload's loaded function is still the one Numba uses
        on ``device_id`` (a context reset unloads modules)."""
        return self.cache.get(device_id) is self.cufunc

    def pack(self, args: tuple[Any, ...]) -> int | None:
        """Write ``args`` into this thread's parameter buffer
        (:func:`numba_streamsafe.numba.launch.packing.pack_into`).

        Returns
        -------
        int or None
            The address of the parameter pointer array, or None when a value
            does not fit its parameter (Numba's path then converts it).
        """
        fields: list[Any] = []
        for kind, arg in zip(self.kinds, args, strict=True):
            if kind == _ARRAY:
                cached = getattr(arg, "_nss_fast", None)
                fields.append(cached.fields if cached is not None else array_fields(arg))
            else:
                fields.append(None)
        scratch = self._scratch
        if packing.pack_into(self.codes, args, fields, scratch.buffer, scratch.base,
                              scratch.size) < 0:
            return None
        return scratch.address  # type: ignore[no-any-return]


#: What a device array's Numba type depends on -> that type (Numba's own
#: ``_numba_type_``, built once per kind of array: it makes a new type object
#: through Numba's interning each time it is asked, a cost per launch for a
#: program that makes new arrays every step).
_array_types: dict = {}


def _array_type(arg: Any) -> Any:
    """``arg._numba_type_`` of a device array, from :data:`_array_types` where
    the array's class, dtype (as Numba types it), dimensions, contiguity and
    broadcasting (all it depends on) were met before."""
    dummy = getattr(arg, "_dummy", None)
    if dummy is None:
        return arg._numba_type_
    try:
        # The dtype as Numba types it: NumPy's equality ignores a record's alignment.
        key = (arg.__class__, numpy_support.from_dtype(arg.dtype), dummy.ndim,
               dummy.is_c_contig, dummy.is_f_contig, 0 in dummy.strides and dummy.size != 0)
    except AttributeError:  # another layout of Numba's array internals
        return arg._numba_type_
    ty = _array_types.get(key)
    if ty is None:
        ty = arg._numba_type_
        if len(_array_types) < 1024:
            _array_types[key] = ty
    return ty


def _argtype(arg: Any) -> Any:
    """The Numba type of one argument, or None when the direct path does not
    cover it."""
    ty = PY_SCALARS.get(type(arg))
    if ty is not None:
        return ty
    if getattr(arg, "gpu_data", None) is not None:
        return _array_type(arg)
    # A NumPy scalar; not a 0-d array of any kind (a host one, or one of CuPy
    # or PyTorch): it has no ``gpu_data`` to pass, so Numba's path marshals it.
    if isinstance(arg, np.generic):
        from numba.cuda.typing.typeof import Purpose, typeof

        return typeof(arg, Purpose.argument)
    return None


def _accepts(param: Any, arg: Any) -> bool:
    """Whether an argument of type ``arg`` may be passed where the overload
    declares ``param`` without conversion."""
    if param == arg:
        return True
    if param == types.boolean:
        # Numba converts a number to a boolean parameter its own way (0.5 gives
        # False there; struct packing would give True): its path does it.
        return False
    if isinstance(param, types.Array) and isinstance(arg, types.Array):
        return (param.dtype == arg.dtype and param.ndim == arg.ndim and param.layout == "A"
                and param.mutable == arg.mutable)
    # Scalars convert as Numba's marshalling does (packing refuses what does not fit).
    return param in _SCALAR_CODES and arg in _SCALAR_CODES


def argtypes_of(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The Numba types of ``args``, or None when one is not covered."""
    argtypes = []
    for arg in args:
        ty = _argtype(arg)
        if ty is None:
            return None
        argtypes.append(ty)
    return tuple(argtypes)


#: :func:`build_plan`'s answer for a kernel the direct path never covers.
UNSUPPORTED = "unsupported"


def build_plan(dispatcher: Any, argtypes: tuple[Any, ...]) -> LaunchPlan | str | None:
    """The plan of the overload ``dispatcher`` would run for ``argtypes``.

    Returns
    -------
    LaunchPlan, UNSUPPORTED or None
        The plan; :data:`UNSUPPORTED` when the direct path does not apply to
        these types (a conversion needed, an argument it does not marshal, a
        debug, cooperative or launch-configuration sensitive kernel); None when
        the overload is not compiled yet.
    """
    overloads = dispatcher.overloads
    if dispatcher.specialized:
        kernel = next(iter(overloads.values()))
        declared = tuple(kernel.argument_types)
        if len(declared) != len(argtypes) or not all(map(_accepts, declared, argtypes)):
            return UNSUPPORTED
    else:
        kernel = overloads.get(argtypes)
        if kernel is None:
            # ``forall`` launches through a specialized copy of the dispatcher.
            for (_, types_), spec in list(getattr(dispatcher, "specializations", {}).items()):
                if types_ == argtypes and spec.overloads:
                    kernel = next(iter(spec.overloads.values()))
                    break
            else:
                return None
        declared = argtypes
    if (kernel.debug or kernel.cooperative or getattr(kernel, "launch_config_sensitive", False)
            or dispatcher.targetoptions.get("extensions")
            or getattr(dispatcher, "_launch_config_sensitive", False)):
        return UNSUPPORTED
    slots = param_slots(declared)
    if slots is None:
        return UNSUPPORTED
    return LaunchPlan(kernel, declared)


class DirectLaunches:
    """One kernel's direct launches on the Python path: its plans per device
    and tuple of argument types, and, after a launch, what the compiled launch
    (:func:`numba_streamsafe.numba.launch.launcher.launch`, either build) needs
    to take the next launches like it.

    A :class:`~numba_streamsafe.numba.launch.kernel.TrackedKernel` holds one
    (``kernel.direct``) and hands it each launch's resolved arguments.
    """

    __slots__ = ("_plans",)

    def __init__(self) -> None:
        #: device -> argument types -> plan (or UNSUPPORTED); a plan holds one
        #: device's loaded function.
        self._plans: dict[int, dict[tuple[Any, ...], LaunchPlan | str]] = {}

    def plan(self, dispatcher: Any, device: int, argtypes: tuple[Any, ...]) -> LaunchPlan | None:
        """The plan of ``dispatcher``'s overload for ``argtypes`` on ``device``,
        or None (Numba launches: not compiled yet, not covered, or unloaded)."""
        plans = self._plans.get(device)
        if plans is None:
            plans = self._plans[device] = {}
        plan = plans.get(argtypes)
        if plan is None:
            plan = build_plan(dispatcher, argtypes)
            if plan is None:  # not compiled yet: Numba compiles it on this launch
                return None
            plans[argtypes] = plan
        if plan is UNSUPPORTED:
            return None
        assert isinstance(plan, LaunchPlan)
        if not plan.current(device):  # another device's function, or unloaded (reset)
            del plans[argtypes]
            return None
        return plan

    def launch(self, kernel: TrackedKernel, rt: Any, args: tuple[Any, ...], uses: Uses,
               dims: tuple[tuple[int, int, int], tuple[int, int, int], int], handle: int,
               owner: Any, strict: bool, tracking: bool) -> bool:
        """``kernel``'s launch as one ``cuLaunchKernel`` of the overload's plan,
        fenced with ``uses``; False (nothing queued) when no plan applies or a
        value does not fit its parameter."""
        argtypes = argtypes_of(args)
        if argtypes is None:
            return False
        plan = self.plan(kernel.dispatcher, rt.device, argtypes)
        if plan is None:
            return False
        capture = rt.capture
        # The next launches like it go to the compiled launch, unless a graph
        # captures this one or it is ordered after foreign streams.
        remember = capture is None and tracking and not uses.untracked and not uses.producers
        if remember:
            self._remember(kernel, rt, plan, args, argtypes, handle, owner)
        params = plan.pack(args)
        if params is None:
            return False
        grid, block, shmem = dims
        if grid[0] * grid[1] * grid[2] < 128 and kernel.kind.warns:
            warn_low_occupancy(kernel, grid)
        fenced(rt, handle, uses, kernel.__name__, strict, owner, rt.driver.launch_kernel,
               plan.function, grid, block, shmem, handle, params, tracking=tracking)
        if capture is not None:
            # Captured: the graph holds the arrays, which the packed parameters
            # name only by address (numba_streamsafe.graphs).
            capture.keep(handle, args)
        return True

    def _remember(self, kernel: TrackedKernel, rt: Any, plan: LaunchPlan,
                  args: tuple[Any, ...], argtypes: tuple[Any, ...], handle: int,
                  owner: Any) -> None:
        """Let the compiled launch take the next launches like this one: the
        kernel's state on ``rt`` (:func:`launch_state_for`), the plan under its
        argument types, each array's launch fields cached on the array (which
        :meth:`LaunchPlan.pack` then reads) and the stream's handle cached on
        the stream object."""
        state = kernel.launch_state
        if state is None or state.rt is not rt:
            state = kernel.launch_state = launch_state_for(kernel, rt)
            if state is None:
                return
        # Python scalars are matched by their type, arrays by their Numba type.
        keys = tuple(type(a) if type(a) in PY_SCALARS else t
                     for a, t in zip(args, argtypes, strict=True))
        state.add_plan(launcher.Plan(keys, plan.function, plan.codes, plan.cache,
                                     plan.cufunc, rt.device))
        for (_, access), arg, ty in zip(kernel.params, args, argtypes, strict=True):
            if access is not None:
                cached_fields(arg, ty)
        program_order.cache_stream(rt, owner, handle)


def _numba_warns_low_occupancy() -> bool:
    """Whether Numba's settings ask for its low-occupancy warning."""
    from numba.cuda.core import config as numba_config

    return bool(getattr(numba_config, "CUDA_LOW_OCCUPANCY_WARNINGS", False)
                and not getattr(numba_config, "DISABLE_PERFORMANCE_WARNINGS", False))


def warn_low_occupancy(kernel: TrackedKernel, grid: tuple[int, int, int]) -> None:
    """Numba's low-occupancy warning for a direct launch: once per kernel and
    grid, when Numba's settings ask for it (Numba warns once per configuration)."""
    size = grid[0] * grid[1] * grid[2]
    if size >= 128 or grid in kernel.warned_grids:
        return
    if _numba_warns_low_occupancy():
        from numba.cuda.core.errors import NumbaPerformanceWarning

        kernel.warned_grids.add(grid)
        warnings.warn(NumbaPerformanceWarning(
            f"Grid size {size} will likely result in GPU under-utilization due to low "
            "occupancy."), stacklevel=access_check.user_stacklevel())


def launch_state_for(kernel: TrackedKernel, rt: Any) -> launcher.LaunchState | None:
    """What the direct launch (:func:`~.launcher.launch`) reads for ``kernel``
    on ``rt``, or None where it does not apply: a resource other than
    :class:`AsyncResource`, or a driver that checks accesses or launches no
    compiled code (the simulated one)."""
    from numba_streamsafe.resources.async_resource import AsyncResource

    if (type(rt.resource) is not AsyncResource or rt.driver.traces_accesses
            or not rt.driver.supports_direct_launch):
        return None
    no_warn = not (kernel.kind.warns and _numba_warns_low_occupancy())
    accesses = tuple(-1 if access is None else int(access) for _, access in kernel.params)
    names = tuple(name for name, access in kernel.params if access is not None)
    return launcher.LaunchState(rt, launch_policy(rt), accesses, kernel.warned_grids,
                                no_warn, kernel.__name__, names, kernel.kind.library,
                                _new_fields)
