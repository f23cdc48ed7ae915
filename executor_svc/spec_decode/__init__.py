"""Speculative decoding: verification (rejection sampling), the draft proposer, draft loading."""
