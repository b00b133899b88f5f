"""Every public function and class (``numba_streamsafe.__all__``) documents its
contract in numpydoc sections: Parameters when it takes any, Returns (or
Yields) when it returns something; classes their Parameters or Attributes.
Exceptions, enumerations and constants are exempt (their names and members
say it)."""

from __future__ import annotations

import enum
import inspect

import pytest
from numpydoc.docscrape import ClassDoc, FunctionDoc

import numba_streamsafe as nss


def _lacks(name: str) -> list[str]:
    obj = getattr(nss, name)
    if not callable(obj) or isinstance(obj, enum.Enum):
        return []  # a constant (Read, POOL_KEEP_ALL, ...)
    if inspect.isclass(obj):
        if issubclass(obj, (BaseException, enum.Enum)):
            return []
        doc = ClassDoc(obj)
        try:
            params = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            params = []
        return ["Parameters or Attributes"] if params and not (
            doc["Parameters"] or doc["Attributes"]) else []
    doc = FunctionDoc(obj)
    sig = inspect.signature(obj)
    lacks = []
    if [p for p in sig.parameters if p != "self"] and not doc["Parameters"]:
        lacks.append("Parameters")
    returns = sig.return_annotation
    if returns not in (None, "None", inspect.Signature.empty) and not (
            doc["Returns"] or doc["Yields"]):
        lacks.append("Returns or Yields")
    return lacks


@pytest.mark.parametrize("name", nss.__all__)
def test_public_names_have_numpydoc_sections(name):
    assert _lacks(name) == [], f"numba_streamsafe.{name}'s docstring lacks {_lacks(name)}"
