"""The pytest plugin's entry point (``pytest11``): its option and the switch
that turns it on, importing nothing of ``numba_streamsafe`` (nor Numba)
until it is asked for with ``pytest --streamsafe`` or ``-p
numba_streamsafe.pytest_plugin``.

Every pytest session of an environment where the package is installed loads
this module, so it stays this small: a session that does not ask for the
plugin pays for no import of the package, and a setting the package would
refuse (a misspelt ``NUMBA_STREAMSAFE_*`` variable) stops only the sessions
that ask for it. The plugin itself is :mod:`numba_streamsafe.pytest_plugin`,
which takes these two hooks from here; the entry point is named as that
module, so that either way of asking loads the plugin once.
"""

from __future__ import annotations

import pytest

__all__ = ["NAME", "pytest_addoption", "pytest_configure"]

#: The plugin's module, as ``-p`` names it (and the entry point's name).
NAME = "numba_streamsafe.pytest_plugin"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--streamsafe``."""
    group = parser.getgroup("numba_streamsafe")
    group.addoption("--streamsafe", action="store_true", default=False,
                    help="fail each test that makes a race, with its report (check mode, the "
                         "simulator's checker, or the race check on a GPU)")


def pytest_configure(config: pytest.Config) -> None:
    """Turn the plugin on where ``--streamsafe`` or ``-p`` asks for it: import
    it, and register its hooks (:class:`numba_streamsafe.pytest_plugin.RacePlugin`)."""
    plugins = getattr(config.option, "plugins", None) or []
    if config.getoption("streamsafe", False) or NAME in plugins:
        if not config.pluginmanager.has_plugin("numba_streamsafe-races"):
            from numba_streamsafe.pytest_plugin import RacePlugin

            config.pluginmanager.register(RacePlugin(), "numba_streamsafe-races")
