"""Side-by-side benchmarks (see each module's docstring for how to reproduce)."""
