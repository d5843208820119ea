"""The worked task: the doubling task of seed 000, its tiny models, supervised stages and evaluation."""
