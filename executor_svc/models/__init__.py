"""Model definitions. One file per family; Llama covers Llama, Mistral, Qwen2 and Qwen3."""
