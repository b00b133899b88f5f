"""Sphinx configuration of the numba_streamsafe documentation.

Built offline (no intersphinx fetches): ``nox -s docs``, or
``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # importable without a GPU

import numba_streamsafe  # noqa: E402

project = "numba_streamsafe"
release = version = numba_streamsafe.__version__
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "api/generated/*.md"]
autosummary_generate = True
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
myst_heading_anchors = 3
html_theme = "alabaster"
html_static_path: list[str] = []
templates_path = ["_templates"]


def _write_api_index() -> None:
    """``api/index.rst``: one autosummary entry per name of ``__all__``, so
    every public name has a page and none is forgotten."""
    names = list(numba_streamsafe.__all__)
    lines = [
        "API reference",
        "=============",
        "",
        "Every name of ``numba_streamsafe.__all__``, generated from its docstring.",
        "",
        ".. currentmodule:: numba_streamsafe",
        "",
        ".. autosummary::",
        "   :toctree: generated",
        "",
        *(f"   {name}" for name in names),
        "",
    ]
    path = os.path.join(HERE, "api", "index.rst")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = "\n".join(lines)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


_write_api_index()  # before autosummary reads it
