"""The optional compiled hot path (numba_streamsafe/_hot.c, limited API).

Everything else is in pyproject.toml. The extension is optional: where it
cannot be built, the package installs and runs its pure-Python path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "numba_streamsafe._hot",
            ["numba_streamsafe/_hot.c"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            extra_compile_args=["-O2"],
            libraries=["dl"],
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
