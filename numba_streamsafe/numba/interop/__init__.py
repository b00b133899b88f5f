"""Arrays crossing to and from other libraries: DLPack, the CUDA Array Interface, and
consumers ordered after a block's known uses.
"""
