"""What shows a program's work rather than doing it: the trace and its
records, export and timeline picture, race checks, memory statistics and the
launch recorder. ``tracehook`` (the slot the hot paths read) sits at the
bottom of the layers; the rest sit above the protocol."""
