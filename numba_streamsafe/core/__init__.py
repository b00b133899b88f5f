"""The lowest layer: what every other part shares and that depends on nothing
else of the package: errors, accesses, blocks, streams, modes and settings."""
