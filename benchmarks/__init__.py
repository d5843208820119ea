"""The benchmarks: each a script that writes benchmarks/results/NAME.json and its table; ``harness`` holds what
those that run rows share."""
