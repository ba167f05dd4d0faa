"""Project tooling, run from the repository root as ``python -m tools.NAME``: the generated blocks of
docs/PERFORMANCE.md and docs/RELIABILITY.md, mutation testing, the test-order and suite-time records,
and the GPU machine's wheelhouse. Benchmarks themselves are in bench/."""
