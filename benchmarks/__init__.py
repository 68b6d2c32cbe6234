"""Side-by-side benchmarks: equal settings, ratios, order alternated; run as `python -m benchmarks.NAME`.

`common` is the one shared library (timing, seeds, spread, JSON records); each other module is one
benchmark with a `--help`. They use rayrl through its public entry points.
"""
