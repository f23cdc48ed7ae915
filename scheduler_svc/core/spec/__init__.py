"""Speculative decoding in the scheduler core (no torch): the proposer and the settling of
verify rows (decoder.py), prompt lookup (ngram.py), verify rows in flight (rows.py), which
requests speculate (gate.py) and whether speculation pays at all (trials.py). The config itself
is llmserve/speculative.py, shared with the launcher and the executor."""
