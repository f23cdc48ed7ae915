"""The OpenAI-compatible HTTP API of the scheduler's API process (--http-port)."""
