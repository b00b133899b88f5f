"""Adaptors over a memory resource: a byte budget (``budget``), a log of every call
(``logging_resource``), and the debug guard that checks each block's uses and bounds
(``guard``)."""
