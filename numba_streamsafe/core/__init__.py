"""The lowest layer: what every other part shares and that depends on nothing
else of the package: errors, accesses, blocks, streams, modes, settings, and
the slot of the active trace (``tracehook``)."""
