"""What shows a program's work rather than doing it: the trace and its
records, export and timeline picture, race checks, memory statistics and the
launch recorder, above the protocol (the slot of the active trace, which the
hot paths read, is :mod:`numba_streamsafe.core.tracehook`)."""
