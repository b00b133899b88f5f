"""What the tests share: random multi-stream programs and their runs on either engine
build (``programs``, ``engine_runs``, ``engine_env``), the access-inference corpus,
kernels whose module defers its annotations, and the names the documentation's code
blocks use (``doc_prelude``, run before each block)."""
