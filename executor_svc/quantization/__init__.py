"""Quantized weights: which checkpoint quantization configs we serve (schemes) and the FP8
linear layer that holds and applies them (fp8). docs/models.md, "FP8 weights"."""
