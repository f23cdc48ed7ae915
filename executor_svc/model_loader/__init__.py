"""Model loading: which folder, config checks, safetensors loading, the GGUF converter, random weights."""
