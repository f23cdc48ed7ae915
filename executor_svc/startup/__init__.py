"""Start-up: the composition root (build_runner) and KV-cache sizing and allocation."""
