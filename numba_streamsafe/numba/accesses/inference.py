"""What a kernel does with each parameter, read from its Numba IR.

:func:`infer_access` runs Numba's front end on the kernel's Python function
(``numba.core.compiler.run_frontend``: the untyped IR every overload is
compiled from, the same on a GPU and under Numba's CUDA simulator) and
follows every value that may alias a parameter:

* views: slices (``a[1:]``), indexing that leaves dimensions (``a[i]`` of a
  2-D array), attributes other than the metadata ones (``a.T``), array
  methods (``a.reshape(...)``), local names and tuples holding them,
  iteration (``for row in a``);
* writes: item and slice assignment (``a[i] = v``, ``row[j] = v``), in-place
  operators on views, ``cuda.atomic.*`` (read-write), ``out=`` of a NumPy
  call, attribute assignment;
* reads: indexing, passing to a known read-only call, iteration;
* device functions (``@cuda.jit(device=True)``) are analysed in turn, their
  parameters mapped to the caller's arguments;
* ``a.shape``, ``a.size``, ``a.ndim``, ``a.dtype``, ``len(a)`` and the like
  read metadata only: a parameter used only so is *untouched*.

Anything else a parameter reaches (a call the analysis does not know, a
closure) counts as read and written: the result may over-approximate a
kernel's accesses, never under-approximate them. Control flow is ignored
(every statement of every block counts), which is also an over-approximation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from numba_streamsafe.core.access import Access
from numba_streamsafe.numba.accesses.inference_calls import (
    METADATA_CALLS,
    MISSING,
    atomics,
    device_py_func,
    is_read_only_call,
    resolve_attr,
)

__all__ = ["ParamUse", "infer_access", "infer_params"]

#: Attributes that read an array's metadata only.
_METADATA = frozenset({"shape", "size", "ndim", "dtype", "strides", "itemsize", "nbytes",
                       "layout", "flags"})
#: Array methods that return a view and touch no element.
_VIEW_METHODS = frozenset({"reshape", "view", "ravel", "transpose", "swapaxes", "squeeze",
                           "T", "real", "imag", "flat", "bind"})
_lock = threading.Lock()
_cache: dict[Any, tuple[ParamUse, ...]] = {}


@dataclass
class ParamUse:
    """What a kernel does with one parameter: ``read`` and ``written``, with
    the ``file:line`` of the first write (``where``), and ``why`` when the
    analysis assumed an access it could not see (an unknown call)."""

    name: str
    read: bool = False
    written: bool = False
    where: str | None = None
    why: str | None = None

    @property
    def access(self) -> Access | None:
        """The inferred access (None: untouched)."""
        if self.read and self.written:
            return Access.READ_WRITE
        if self.written:
            return Access.WRITE
        if self.read:
            return Access.READ
        return None


@dataclass
class _Analysis:
    params: list[str]
    #: var name -> parameter indices it may be (a view of) the whole array of.
    views: dict[str, set[int]] = field(default_factory=dict)
    #: var name -> parameter indices it may hold an element (or row) of.
    elems: dict[str, set[int]] = field(default_factory=dict)
    #: var name -> the Python object it statically holds (globals, attributes of them).
    values: dict[str, Any] = field(default_factory=dict)
    #: var name -> per item (views, elems), for tuples built in the kernel.
    tuples: dict[str, list[tuple[set[int], set[int]]]] = field(default_factory=dict)
    #: vars that hold a slice (or a tuple with one): indexing with them makes a view.
    slices: set[str] = field(default_factory=set)


class _Walker:
    """One function's IR: alias sets to a fixpoint, then the effects."""

    def __init__(self, func: Callable[..., Any], depth: int) -> None:
        from numba.core.compiler import run_frontend

        self.func = func
        self.depth = depth
        self.ir = run_frontend(func)
        self.a = _Analysis(list(self.ir.arg_names))
        self.uses = [ParamUse(n) for n in self.a.params]
        self.atomics = atomics()

    # ------------------------------------------------------------ aliasing
    def _v(self, var: Any) -> set[int]:
        return self.a.views.get(getattr(var, "name", ""), set())

    def _e(self, var: Any) -> set[int]:
        return self.a.elems.get(getattr(var, "name", ""), set())

    def _any(self, var: Any) -> set[int]:
        return self._v(var) | self._e(var)

    def _add(self, table: dict[str, set[int]], name: str, params: set[int]) -> bool:
        if not params:
            return False
        cur = table.setdefault(name, set())
        if params <= cur:
            return False
        cur |= params
        return True

    def _alias_step(self, stmt: Any) -> bool:
        from numba.core import ir

        if not isinstance(stmt, ir.Assign):
            return False
        name, value = stmt.target.name, stmt.value
        a = self.a
        changed = False
        if isinstance(value, ir.Arg):
            changed |= self._add(a.views, name, {value.index})
        elif isinstance(value, ir.Var):
            changed |= self._add(a.views, name, self._v(value))
            changed |= self._add(a.elems, name, self._e(value))
            changed |= self._copy_static(value.name, name)
        elif isinstance(value, ir.Const):
            if isinstance(value.value, slice):
                changed |= self._slice(name)
            elif name not in a.values:
                a.values[name] = value.value
                changed = True
        elif isinstance(value, (ir.Global, ir.FreeVar)):
            if name not in a.values:
                a.values[name] = value.value
                changed = True
        elif isinstance(value, ir.Expr):
            changed |= self._alias_expr(name, value)
        return changed

    def _copy_static(self, src: str, dst: str) -> bool:
        """``dst = src``: the static value, tuple items and slice-ness go along."""
        a = self.a
        changed = False
        if src in a.values and dst not in a.values:
            a.values[dst] = a.values[src]
            changed = True
        if src in a.tuples and dst not in a.tuples:
            a.tuples[dst] = a.tuples[src]
            changed = True
        if src in a.slices:
            changed |= self._slice(dst)
        return changed

    def _slice(self, name: str) -> bool:
        if name in self.a.slices:
            return False
        self.a.slices.add(name)
        return True

    def _is_slice_index(self, e: Any) -> bool:
        index = getattr(e, "index_var", None) if e.op == "static_getitem" else e.index
        if e.op == "static_getitem":
            const = e.index
            if isinstance(const, slice) or (isinstance(const, tuple) and any(
                    isinstance(c, slice) for c in const)):
                return True
        return index is not None and getattr(index, "name", None) in self.a.slices

    def _tuple_item(self, e: Any) -> tuple[set[int], set[int]] | None:
        """The item ``t[k]`` of a tuple built in the kernel, with a constant ``k``."""
        items = self.a.tuples.get(e.value.name)
        if items is None:
            return None
        if e.op == "static_getitem":
            k = e.index
        else:
            k = self.a.values.get(getattr(e.index, "name", ""), MISSING)
        if isinstance(k, int) and not isinstance(k, bool) and -len(items) <= k < len(items):
            return items[k]
        return None

    def _alias_getitem(self, name: str, e: Any) -> bool:
        a = self.a
        item = self._tuple_item(e)
        if item is not None:  # (a, b)[0] is a itself
            return self._add(a.views, name, item[0]) | self._add(a.elems, name, item[1])
        if self._is_slice_index(e):  # a[1:] is a view
            return self._add(a.views, name, self._any(e.value))
        # A full index gives an element (of a 1-D array) or a row (of a 2-D
        # one): either may be written through.
        return self._add(a.elems, name, self._any(e.value))

    def _alias_expr(self, name: str, e: Any) -> bool:
        a = self.a
        op = e.op
        changed = False
        if op in ("getitem", "static_getitem", "typed_getitem"):
            changed |= self._alias_getitem(name, e)
        elif op == "getattr":
            if e.attr not in _METADATA:
                changed |= self._add(a.views, name, self._any(e.value))
            base = a.values.get(e.value.name, MISSING)
            if base is not MISSING and name not in a.values:
                value = resolve_attr(base, e.attr)
                if value is not MISSING:
                    a.values[name] = value
                    changed = True
        elif op in ("build_tuple", "build_list", "build_set"):
            changed |= self._alias_build(name, e)
        elif op == "exhaust_iter":
            changed |= self._add(a.views, name, self._v(e.value))
            changed |= self._add(a.elems, name, self._e(e.value))
            changed |= self._copy_static(e.value.name, name)
        elif op in ("getiter", "iternext", "pair_first", "cast"):
            changed |= self._add(a.elems if op == "getiter" else a.views, name, self._any(e.value))
            if op != "getiter":
                changed |= self._add(a.elems, name, self._e(e.value))
        elif op in ("binop", "inplace_binop"):
            changed |= self._add(a.elems, name, self._any(e.lhs) | self._any(e.rhs))
        elif op == "call":
            changed |= self._alias_call(name, e)
        return changed

    def _alias_build(self, name: str, e: Any) -> bool:
        a = self.a
        changed = False
        for item in e.items:
            changed |= self._add(a.views, name, self._any(item))
        if e.op == "build_tuple":
            fresh = [(set(self._v(i)), set(self._e(i))) for i in e.items]
            if a.tuples.get(name) != fresh:
                a.tuples[name] = fresh
                changed = True
        if any(getattr(i, "name", None) in a.slices for i in e.items):
            changed |= self._slice(name)
        return changed

    def _alias_call(self, name: str, e: Any) -> bool:
        a = self.a
        reach: set[int] = self._any(e.func)
        for arg in list(e.args) + [v for _, v in e.kws]:
            reach = reach | self._any(arg)
        if e.vararg is not None:
            reach = reach | self._any(e.vararg)
        callee = a.values.get(e.func.name, MISSING)
        if callee is slice:
            return self._slice(name)
        if callee is not MISSING:
            if callee in self.atomics or callee in METADATA_CALLS:
                return False  # the old value, a length: no array
            if device_py_func(callee) is None and is_read_only_call(callee):
                # min(a[i], b[i]), math.sqrt(x): a value, at most an element.
                return self._add(a.elems, name, reach)
        # A device function or an unknown call may return a view of its arguments.
        return self._add(a.views, name, reach)

    # ------------------------------------------------------------- effects
    def _mark(self, params: set[int], *, read: bool = False, write: bool = False,
              loc: Any = None, why: str | None = None) -> None:
        for i in params:
            use = self.uses[i]
            if read:
                use.read = True
            if write:
                if not use.written and loc is not None:
                    use.where = f"{loc.filename}:{loc.line}"
                use.written = True
            if why and use.why is None:
                use.why = why

    def _effects(self, stmt: Any) -> None:
        from numba.core import ir

        loc = getattr(stmt, "loc", None)
        if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            self._mark(self._any(stmt.target), write=True, loc=loc)
        elif isinstance(stmt, ir.SetAttr):
            self._mark(self._any(stmt.target), write=True, loc=loc)
        elif isinstance(stmt, ir.StoreMap):
            self._unknown([stmt.value], loc, "stored in a dict")
        elif isinstance(stmt, ir.Print):
            for arg in stmt.args:
                self._mark(self._any(arg), read=True)
        elif isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr):
            self._expr_effects(stmt.value, loc)

    def _expr_effects(self, e: Any, loc: Any) -> None:
        op = e.op
        if op in ("getitem", "static_getitem", "typed_getitem"):
            if self._tuple_item(e) is None and not self._is_slice_index(e) and \
                    e.value.name not in self.a.tuples:
                self._mark(self._any(e.value), read=True)
        elif op == "getiter":
            self._mark(self._any(e.value), read=True)
        elif op == "inplace_binop":
            # ``view += x`` writes the array; a loaded element is a local copy.
            self._mark(self._v(e.lhs), read=True, write=True, loc=loc)
            self._mark(self._any(e.rhs), read=True)
        elif op == "call":
            self._call_effects(e, loc)
        elif op == "make_function":
            for cell in (e.closure or ()) if isinstance(e.closure, (tuple, list)) else ():
                self._mark(self._any(cell), read=True, write=True, loc=loc,
                           why="captured by a closure")

    def _call_effects(self, e: Any, loc: Any) -> None:
        a = self.a
        callee = a.values.get(e.func.name, MISSING)
        positional = list(e.args)
        kws = dict(e.kws)
        if e.vararg is not None or e.varkwarg is not None:
            self._unknown(positional + list(kws.values()) + [e.vararg, e.varkwarg], loc,
                          "passed through *args/**kwargs")
            return
        if callee is MISSING:
            if self._v(e.func) and _method_name(self, e.func) in _VIEW_METHODS:
                return  # a.reshape(...): a view, no element touched
            self._unknown(positional + list(kws.values()) + [e.func], loc,
                          "passed to a call the analysis cannot resolve")
            return
        if callee in self.atomics:
            if positional:
                self._mark(self._any(positional[0]), read=True, write=True, loc=loc)
            for arg in positional[1:] + list(kws.values()):
                self._mark(self._any(arg), read=True)
            return
        if callee in METADATA_CALLS:
            return
        py = device_py_func(callee)
        if py is not None:
            self._device_call(py, positional, kws, loc)
            return
        if is_read_only_call(callee):
            for arg in positional:
                self._mark(self._any(arg), read=True)
            for key, arg in kws.items():
                out = key == "out"
                self._mark(self._any(arg), read=True, write=out, loc=loc)
            return
        name = getattr(callee, "__name__", repr(callee))
        self._unknown(positional + list(kws.values()), loc, f"passed to {name}(), not analysed")

    def _device_call(self, py: Callable[..., Any], positional: list[Any], kws: dict[str, Any],
                     loc: Any) -> None:
        if self.depth >= _MAX_DEPTH:
            self._unknown(positional + list(kws.values()), loc, "device calls nested too deep")
            return
        try:
            inner = _analyse(py, self.depth + 1)
        except Exception:
            self._unknown(positional + list(kws.values()), loc,
                          f"passed to device function {py.__name__}, which could not be analysed")
            return
        by_name = {u.name: u for u in inner}
        pairs = [(inner[i], arg) for i, arg in enumerate(positional) if i < len(inner)]
        pairs += [(by_name[k], arg) for k, arg in kws.items() if k in by_name]
        for use, arg in pairs:
            params = self._any(arg)
            self._mark(params, read=use.read)
            if use.written:
                self._mark(params, write=True, loc=loc)
            if use.why:
                self._mark(params, why=use.why)

    def _unknown(self, args: list[Any], loc: Any, why: str) -> None:
        for arg in args:
            if arg is not None:
                self._mark(self._any(arg), read=True, write=True, loc=loc, why=why)

    def run(self) -> tuple[ParamUse, ...]:
        stmts = [stmt for block in self.ir.blocks.values() for stmt in block.body]
        for _ in range(64):  # to a fixpoint; alias sets only grow
            if not any([self._alias_step(s) for s in stmts]):
                break
        for stmt in stmts:
            self._effects(stmt)
        return tuple(self.uses)


def _method_name(w: _Walker, var: Any) -> str | None:
    """The attribute name a call's function variable was loaded with (``a.reshape``)."""
    from numba.core import ir

    for block in w.ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign) and stmt.target.name == var.name and \
                    isinstance(stmt.value, ir.Expr) and stmt.value.op == "getattr":
                return str(stmt.value.attr)
    return None


_MAX_DEPTH = 8


def _analyse(func: Callable[..., Any], depth: int = 0) -> tuple[ParamUse, ...]:
    key = getattr(func, "__code__", func)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return tuple(ParamUse(u.name, u.read, u.written, u.where, u.why) for u in hit)
    result = _Walker(func, depth).run()
    with _lock:
        _cache[key] = result
    return tuple(ParamUse(u.name, u.read, u.written, u.where, u.why) for u in result)


def infer_params(func: Callable[..., Any]) -> tuple[ParamUse, ...]:
    """What ``func`` (a kernel's Python function) does with each parameter.

    Cached per function: the IR is read once.

    Raises
    ------
    Exception
        Numba's front end could not read the function (its error, unchanged).
    """
    return _analyse(func)


def infer_access(func: Callable[..., Any]) -> dict[str, Access | None]:
    """The inferred access of each parameter of ``func`` (None: untouched or
    not an array): ``Access.READ``, ``WRITE`` or ``READ_WRITE``."""
    return {u.name: u.access for u in infer_params(func)}
