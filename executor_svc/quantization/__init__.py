"""Quantized weights: which checkpoint quantization configs we serve (schemes), the FP8 linear
layer that holds and applies them (fp8), and a checkpoint's per-layer FP8 KV-cache scales
(kv_scales). docs/models.md, "FP8 weights" and "FP8 KV cache"."""
