"""pyhpc's benchmarks on the lab: ``python -m benchmarks.<name>`` from the repository root
(``make bench``, ``make bench-scale``...); each writes ``benchmarks/results/<name>.json``
(:mod:`benchmarks.record`)."""
