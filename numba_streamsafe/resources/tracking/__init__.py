"""The engine's tracking state, compiled where a compiler is present: the live blocks
and their entries, the wait and commit rules, marks and their events, the trace's
observer, the engine's lock, and freed bytes not yet back in the pool.
"""
