"""GPU tests (a package, so that their module names cannot clash with tests/core)."""
