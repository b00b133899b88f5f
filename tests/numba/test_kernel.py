"""``@tracked_kernel`` on Numba's CUDA simulator over the simulated driver.

Each cross-stream program is run twice: tracked, where the simulated
driver's happens-before checker must see no hazard, and with tracking off,
where it must see one (the negative control that shows the check can fail).
"""


import gc
import warnings

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import (
    Access,
    InvalidArgument,
    Read,
    ReadWrite,
    StaleContext,
    StreamMisuse,
    UncommittedLaunchWarning,
    Write,
    tracked_kernel,
)
from numba_streamsafe.numba.launch.kernel import TrackedKernel

N = 256
GRID, BLOCK = 2, 32


# ----------------------------------------------------------------- kernels
@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += step


@tracked_kernel
def copy(src: Read, dst: Write):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += step


@tracked_kernel
def add_one(a: ReadWrite):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < a.size:
        a[i] += 1
        i += step


def _copy_body(src, dst):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += step


#: Same body, no annotations: strict mode must refuse its arrays.
unannotated_copy = tracked_kernel(_copy_body)
#: Same body, accesses given by name.
copy_by_option = tracked_kernel(access={"src": "r", "dst": "w"})(_copy_body)
#: Same body, permissive: arrays the library does not know launch unordered.
permissive_copy = tracked_kernel(_copy_body, mode="permissive")
#: Same body, strict, but foreign ``__cuda_array_interface__`` arrays accepted.
foreign_ok_copy = tracked_kernel(access={"src": Read, "dst": Write}, allow_foreign=True)(_copy_body)


def host(array):
    return nss.copy_to_host(array)


# ----------------------------------------------------------- access parsing
def test_annotations_are_access_objects():
    assert copy.accesses == {"src": Access.READ, "dst": Access.WRITE}
    assert fill.accesses == {"out": Access.WRITE, "value": None}
    assert add_one.accesses == {"a": Access.READ_WRITE}
    assert Read | Write == ReadWrite
    assert isinstance(copy, TrackedKernel)
    assert copy.__name__ == "copy"
    assert "src: READ" in repr(copy) and "dst: WRITE" in repr(copy)


def test_string_annotations_under_future_import():
    from tests.helpers import future_annotated as fa
    assert fa.by_name.accesses == {"src": Access.READ, "dst": Access.WRITE,
                                   "acc": Access.READ_WRITE, "n": None}
    assert fa.by_attribute.accesses == {"src": Access.READ, "dst": Access.WRITE, "k": None}
    # get_type_hints fails on the undefined name: each annotation's text is read instead.
    assert fa.unresolvable.accesses == {"src": Access.READ, "dst": Access.WRITE, "k": None}
    # Quoted names arrive quoted again ("'r'") and still count.
    assert fa.quoted.accesses == {"src": Access.READ, "dst": Access.WRITE,
                                  "acc": Access.READ_WRITE, "other": None, "n": None}


def test_string_annotated_kernel_launches(rt, streams):
    from tests.helpers import future_annotated as fa
    a, b = streams
    src = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    dst = nss.device_array(N, np.int64, stream=b)
    acc = nss.to_device(np.zeros(N, dtype=np.int64), stream=a)
    fa.by_name[GRID, BLOCK, b](src, dst, acc, N)
    fa.by_attribute[GRID, BLOCK, a](src, dst, 3)
    np.testing.assert_array_equal(nss.copy_to_host(dst, stream=b), 3 * np.arange(N))
    np.testing.assert_array_equal(nss.copy_to_host(acc, stream=b), np.arange(N))
    assert rt.driver.hazards == []


def test_string_annotations_without_future_import():
    def k(src: "r", dst: "write", both: "ReadWrite", other: "not-an-access", n):  # noqa: F821
        pass

    assert tracked_kernel(k).accesses == {"src": Access.READ, "dst": Access.WRITE,
                                          "both": Access.READ_WRITE, "other": None, "n": None}


def test_access_option_gives_and_overrides_access():
    assert unannotated_copy.accesses == {"src": None, "dst": None}
    assert copy_by_option.accesses == {"src": Access.READ, "dst": Access.WRITE}

    def k(src: Read, dst: Write):
        pass

    over = tracked_kernel(k, access={"src": "rw", "dst": Access.READ_WRITE})
    assert over.accesses == {"src": Access.READ_WRITE, "dst": Access.READ_WRITE}
    partial = tracked_kernel(k, access={"dst": "read"})
    assert partial.accesses == {"src": Access.READ, "dst": Access.READ}


def test_access_option_with_unknown_name_is_invalid_argument():
    with pytest.raises(InvalidArgument) as info:
        tracked_kernel(access={"src": Read, "dts": Write})(_copy_body)
    message = str(info.value)
    assert "dts" in message and "src" in message and "dst" in message


def test_access_option_with_unknown_kind_is_value_error():
    with pytest.raises(ValueError, match="not an access kind"):
        tracked_kernel(_copy_body, access={"src": "sideways"})


@pytest.mark.parametrize("source", [
    "def k(a: Read, *, n):\n    pass\n",
    "def k(a: Read, *rest):\n    pass\n",
    "def k(a: Read, **options):\n    pass\n",
])
def test_non_positional_parameters_are_invalid_argument(source):
    namespace = {"Read": Read}
    exec(source, namespace)
    with pytest.raises(InvalidArgument, match="positional"):
        tracked_kernel(namespace["k"])


# ---------------------------------------------------------- launch helpers
def configure(kernel, form, stream):
    """``kernel`` configured in one of the four launch forms on ``stream``."""
    if form == "grid_block":  # the default stream
        return kernel[GRID, BLOCK]
    if form == "grid_block_stream":
        return kernel[GRID, BLOCK, stream]
    if form == "grid_block_stream_shmem":
        return kernel[GRID, BLOCK, stream, 0]
    if form == "forall":
        return kernel.forall(N, stream=stream)
    raise AssertionError(form)


FORMS = ["grid_block", "grid_block_stream", "grid_block_stream_shmem", "forall"]


def stream_of(form, stream):
    return None if form == "grid_block" else stream


# --------------------------------------------------- use after write (RAW)
@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
@pytest.mark.parametrize("form", FORMS)
def test_use_after_write_consumer_forms(rt, streams, form, tracked):
    """Producer writes x on a; consumer (in ``form``) reads x on b."""
    a, b = streams
    cs = stream_of(form, b)
    with nss.tracking(tracked):
        x = nss.device_array(N, np.int64, stream=a)
        y = nss.device_array(N, np.int64, stream=cs)
        fill[GRID, BLOCK, a](x, 7)
        configure(copy, form, cs)(x, y)
        out = nss.copy_to_host(y, stream=cs)
    np.testing.assert_array_equal(out, np.full(N, 7))
    if tracked or form == "grid_block":
        # On the legacy default stream the consumer waits for the producer on a
        # blocking stream anyway (CUDA's implicit synchronisation, modelled).
        assert rt.driver.hazards == []
    else:
        assert any(h.kind == "read-after-write" for h in rt.driver.hazards), rt.driver.hazards


@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
@pytest.mark.parametrize("form", FORMS)
def test_use_after_write_producer_forms(rt, streams, form, tracked):
    """Producer (in ``form``) writes x; consumer reads x on b."""
    a, b = streams
    ps = stream_of(form, a)
    with nss.tracking(tracked):
        x = nss.device_array(N, np.int64, stream=ps)
        y = nss.device_array(N, np.int64, stream=b)
        configure(fill, form, ps)(x, 11)
        copy[GRID, BLOCK, b](x, y)
        out = nss.copy_to_host(y, stream=b)
    np.testing.assert_array_equal(out, np.full(N, 11))
    # A producer on the legacy default stream is waited for by the blocking stream b.
    assert (rt.driver.hazards == []) is (tracked or form == "grid_block"), rt.driver.hazards


def test_read_write_chain_across_three_streams(rt, streams):
    a, b = streams
    c = cuda.stream()
    x = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    add_one[GRID, BLOCK, b](x)
    add_one[GRID, BLOCK, c](x)
    add_one.forall(N, stream=a)(x)
    np.testing.assert_array_equal(nss.copy_to_host(x, stream=c), np.arange(N) + 3)
    assert rt.driver.hazards == []


# -------------------------------------------------- write after read (WAR)
@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_write_after_read(rt, streams, tracked):
    a, b = streams
    x = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    y = nss.device_array(N, np.int64, stream=a)
    with nss.tracking(tracked):
        copy[GRID, BLOCK, a](x, y)  # reads x on a
        fill[GRID, BLOCK, b](x, -1)  # overwrites x on b
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=a), np.arange(N))
    np.testing.assert_array_equal(nss.copy_to_host(x, stream=b), np.full(N, -1))
    if tracked:
        assert rt.driver.hazards == []
    else:
        assert any(h.kind == "write-after-read" for h in rt.driver.hazards), rt.driver.hazards


# ----------------------------------------- free after use, address reused
@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_free_after_use_with_address_reuse(rt, streams, tracked):
    a, b = streams
    with nss.tracking(tracked):
        x = nss.device_array(N, np.int64, stream=a)
        fill[GRID, BLOCK, a](x, 1)
        out = nss.device_array(N, np.int64, stream=b)
        copy[GRID, BLOCK, b](x, out)  # x read on b
        old = nss.block_of(x)
        old_ptr = old.ptr
        del x
        gc.collect()
        assert rt.stats().deferred == 1  # the finalizer queued the free; nothing freed yet
        assert rt.find(old_ptr) is old
        y = nss.device_array(N, np.int64, stream=a)  # drains the free of x, on a
        assert nss.block_of(y).ptr == old_ptr, "the simulated pool should reuse x's address"
        assert nss.block_of(y) is not old and nss.block_of(y).generation != old.generation
        fill[GRID, BLOCK, a](y, 2)
        result = nss.copy_to_host(out, stream=b)
    np.testing.assert_array_equal(result, np.ones(N))
    if tracked:
        assert rt.driver.hazards == []
    else:
        assert any(h.kind == "write-after-read" for h in rt.driver.hazards), rt.driver.hazards


def test_free_waits_for_every_reader_stream(rt, streams):
    a, b = streams
    c = cuda.stream()
    x = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    y1 = nss.device_array(N, np.int64, stream=b)
    y2 = nss.device_array(N, np.int64, stream=c)
    copy[GRID, BLOCK, b](x, y1)
    copy[GRID, BLOCK, c](x, y2)
    old_ptr = nss.block_of(x).ptr
    del x
    gc.collect()
    z = nss.device_array(N, np.int64, stream=a)
    assert nss.block_of(z).ptr == old_ptr
    fill[GRID, BLOCK, a](z, 0)
    assert rt.driver.hazards == []
    del y1, y2, z
    gc.collect()
    rt.reap()
    assert rt.bytes_outstanding() == 0


# ---------------------------------------------------------- slices, views
def test_slice_resolves_to_its_array_block(rt):
    x = nss.device_array(N, np.int64)
    block = nss.block_of(x)
    assert block is not None
    assert nss.block_of(x[10:20]) is block
    assert nss.block_of(x[::2]) is block
    m = nss.device_array((8, 16), np.float32)
    assert nss.block_of(m[1:3, 2:5]) is nss.block_of(m)
    assert nss.block_of(m.T) is nss.block_of(m)
    assert nss.block_of(np.zeros(4)) is None


@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_kernel_on_a_slice_is_tracked_on_the_whole_block(rt, streams, tracked):
    a, b = streams
    x = nss.to_device(np.zeros(N, dtype=np.int64), stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    with nss.tracking(tracked):
        fill[GRID, BLOCK, a](x[10:20], 5)  # writes part of x on a
        copy[GRID, BLOCK, b](x, y)  # reads all of x on b
        out = nss.copy_to_host(y, stream=b)
    expected = np.zeros(N, dtype=np.int64)
    expected[10:20] = 5
    np.testing.assert_array_equal(out, expected)
    assert (rt.driver.hazards == []) is tracked, rt.driver.hazards


# ------------------------------------------------------------- bad inputs
def test_unannotated_array_in_strict_mode_is_stream_misuse(rt, streams):
    a, _ = streams
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=a)
    with pytest.raises(StreamMisuse, match="annotate") as info:
        unannotated_copy[GRID, BLOCK, a](x, y)
    assert "'src'" in str(info.value) and "access=" in str(info.value)


def test_unannotated_array_in_permissive_mode_launches(rt):
    kernel = tracked_kernel(_copy_body, mode="permissive")
    x = nss.to_device(np.arange(N, dtype=np.int64))
    y = nss.device_array(N, np.int64)
    kernel[GRID, BLOCK](x, y)
    np.testing.assert_array_equal(host(y), np.arange(N))


@pytest.mark.parametrize("mode", ["bogus", "Permissive", 0])
def test_an_unknown_mode_is_refused_when_the_decorator_is_made(mode):
    with pytest.raises(InvalidArgument, match="mode") as info:
        tracked_kernel(mode=mode)
    message = str(info.value)
    assert repr(mode) in message and "'strict'" in message and "'permissive'" in message
    with pytest.raises(InvalidArgument, match=r"_copy_body: mode"):
        tracked_kernel(_copy_body, mode=mode)


def test_foreign_array_in_strict_mode_is_stream_misuse(rt, streams):
    a, _ = streams
    foreign = cuda.to_device(np.arange(N, dtype=np.int64))  # Numba's, not the library's
    assert nss.block_of(foreign) is None
    y = nss.to_device(np.zeros(N, dtype=np.int64), stream=a)
    with pytest.raises(StreamMisuse, match="not allocated by numba_streamsafe") as info:
        copy[GRID, BLOCK, a](foreign, y)
    assert "permissive" in str(info.value)
    np.testing.assert_array_equal(host(y), np.zeros(N))  # refused before launching
    assert rt.driver.hazards == []


def test_foreign_array_in_permissive_mode_launches(rt, streams):
    a, _ = streams
    foreign = cuda.to_device(np.arange(N, dtype=np.int64))
    y = nss.device_array(N, np.int64, stream=a)
    permissive_copy[GRID, BLOCK, a](foreign, y)
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=a), np.arange(N))
    assert rt.driver.hazards == []


def test_foreign_array_allowed_in_strict_mode_with_allow_foreign(rt):
    foreign = cuda.to_device(np.arange(N, dtype=np.int64))
    y = nss.device_array(N, np.int64)
    foreign_ok_copy[GRID, BLOCK](foreign, y)
    np.testing.assert_array_equal(host(y), np.arange(N))


def test_permissive_runtime_launches_foreign_arrays(rt):
    rt.mode = nss.RecorderMode.PERMISSIVE
    foreign = cuda.to_device(np.arange(N, dtype=np.int64))
    y = nss.device_array(N, np.int64)
    copy[GRID, BLOCK](foreign, y)
    np.testing.assert_array_equal(host(y), np.arange(N))


def test_refused_launch_leaves_no_uncommitted_recorder(rt):
    foreign = cuda.to_device(np.arange(N, dtype=np.int64))
    y = nss.device_array(N, np.int64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            copy[GRID, BLOCK](foreign, y)
        except StreamMisuse:
            pass
        else:
            raise AssertionError("strict mode launched a foreign array")
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, UncommittedLaunchWarning)]


def test_host_array_for_write_parameter_is_invalid_argument(rt):
    out = np.zeros(N, dtype=np.int64)
    with pytest.raises(InvalidArgument, match="host array") as info:
        fill[GRID, BLOCK](out, 3)
    assert "to_device" in str(info.value)
    with pytest.raises(InvalidArgument, match="host array"):
        add_one[GRID, BLOCK](out)
    np.testing.assert_array_equal(out, np.zeros(N))


def test_host_array_for_read_parameter_works(rt, streams):
    a, _ = streams
    y = nss.device_array(N, np.int64, stream=a)
    copy[GRID, BLOCK, a](np.arange(N, dtype=np.int64), y)
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=a), np.arange(N))
    assert rt.driver.hazards == []


@pytest.mark.parametrize("args", [(), (1,), (1, 2, 3)])
def test_wrong_number_of_arguments_is_invalid_argument(rt, args):
    args = tuple(nss.device_array(4, np.int64) for _ in args)
    with pytest.raises(InvalidArgument, match="takes 2 arguments"):
        copy[GRID, BLOCK](*args)


def test_call_without_launch_configuration_is_stream_misuse(rt):
    x = nss.device_array(N, np.int64)
    with pytest.raises(StreamMisuse, match=r"launch configuration.*fill\[grid, block"):
        fill(x, 1)


@pytest.mark.parametrize("config", [1, (1,), (1, 2, 0, 0, 0)], ids=["int", "one", "five"])
def test_bad_launch_configuration_is_invalid_argument(config):
    with pytest.raises(InvalidArgument, match="launch configuration"):
        fill[config]


def test_a_configured_launch_holds_its_kernel_config_and_stream(streams):
    """``kernel[config]`` (built by the compiled Kernel base where compiled)
    keeps the kernel, the configuration as a plain tuple, and its stream (0
    when it names none)."""
    from collections import namedtuple

    from numba_streamsafe.numba.launch.launcher import Launcher

    a, _ = streams
    two = fill[GRID, BLOCK]
    assert type(two) is Launcher and two.kernel is fill and two.stream == 0
    Config = namedtuple("Config", "grid block stream")
    three = fill[Config(GRID, BLOCK, a)]
    assert type(three.config) is tuple and three.config == (GRID, BLOCK, a)
    assert three.stream is a


def test_launch_after_context_reset_is_stale_context(rt, streams):
    a, _ = streams
    x = nss.device_array(N, np.int64, stream=a)
    fill[GRID, BLOCK, a](x, 1)
    epoch = rt.epoch
    rt.reset()
    assert rt.epoch == epoch + 1
    with pytest.raises(StaleContext, match="reset") as info:
        fill[GRID, BLOCK, a](x, 2)
    assert "Allocate it again" in str(info.value)
    with pytest.raises(StaleContext):
        fill[GRID, BLOCK, a](x[1:3], 2)  # a view of it too
    with pytest.raises(StaleContext):
        nss.copy_to_host(x, stream=a)
    # A new allocation works after the reset, and the old array's finalizer is harmless.
    z = nss.device_array(N, np.int64, stream=a)
    fill[GRID, BLOCK, a](z, 3)
    np.testing.assert_array_equal(nss.copy_to_host(z, stream=a), np.full(N, 3))
    del x
    gc.collect()
    rt.flush()
    assert rt.bytes_outstanding() == nss.block_of(z).nbytes


def test_launch_drains_deferred_frees(rt, streams):
    a, _ = streams
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=a)
    del x
    gc.collect()
    assert rt.stats().deferred == 1
    fill[GRID, BLOCK, a](y, 0)
    assert rt.stats().deferred == 0
    assert rt.stats().frees == 1


def test_one_array_passed_twice_is_one_read_write_use(rt, streams):
    a, _ = streams

    @tracked_kernel
    def shift(src: Read, dst: Write):
        i = cuda.grid(1)
        if i + 1 < dst.size:
            dst[i] = src[i + 1]

    x = nss.device_array(64, np.int64, stream=a)
    args, uses, host = shift._arguments(rt, (x, x), a, strict=True, traced=False)
    assert not host and args == (x, x)
    block = nss.block_of(x)
    assert uses.blocks == [(block, Access.READ_WRITE, 0, block.nbytes)], \
        "merged by the access lattice"


def test_the_legacy_stream_and_blocking_streams_wait_for_each_other(rt):
    """The simulated driver orders the legacy default stream with blocking
    streams both ways, as CUDA does, and with non-blocking streams not at all
    (the negative control): untracked work only, so the model alone decides."""
    d = rt.driver
    blocking, nonblocking = d.create_stream(blocking=True), d.create_stream()
    ptr = d.alloc(256)
    d.synchronize()
    for first, second, ordered in ((blocking, 0, True), (0, blocking, True),
                                   (nonblocking, 0, False), (0, nonblocking, False)):
        d.hazards.clear()
        d.trace_access(first, [(ptr, 256, Write)], "first")
        d.trace_access(second, [(ptr, 256, Write)], "second")
        assert (d.hazards == []) is ordered, (first, second, d.hazards)
        d.synchronize()
    d.free(ptr)


def test_the_launch_gil_setting_decides_whether_every_launch_releases_it(monkeypatch):
    """``NUMBA_STREAMSAFE_LAUNCH_GIL=release`` makes every compiled launch release
    the GIL; ``auto`` leaves it to the launches (held while they return promptly);
    ``release_gil(True)`` (a Python host callback queued) holds whatever the setting."""
    from numba_streamsafe.core.settings import reload_settings
    from numba_streamsafe.numba.launch import launcher

    asked = launcher.release_gil(False)
    try:
        monkeypatch.setenv("NUMBA_STREAMSAFE_LAUNCH_GIL", "release")
        reload_settings()
        assert launcher.releases_gil()
        monkeypatch.setenv("NUMBA_STREAMSAFE_LAUNCH_GIL", "auto")
        reload_settings()
        assert not launcher.releases_gil()
        launcher.release_gil(True)
        assert launcher.releases_gil()
        monkeypatch.delenv("NUMBA_STREAMSAFE_LAUNCH_GIL")
        reload_settings()
        assert launcher.releases_gil()  # asked for: the setting's default does not undo it
        launcher.release_gil(False)
        assert not launcher.releases_gil()
    finally:
        monkeypatch.delenv("NUMBA_STREAMSAFE_LAUNCH_GIL", raising=False)
        reload_settings()
        launcher.release_gil(asked)
