"""Sampling: the sampler, its graphs and rows, logits processors, logprobs."""
