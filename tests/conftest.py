"""Test-run settings shared by every test folder: the GPU tests run on one
pytest-xdist worker, one after another (they share the device, and the race
tests' negative controls need it to themselves)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.xdist_group("gpu"))
