"""The public gRPC API of the scheduler's API process (llmserve.v1.LLMServe): the server and its
port (public_server.py), the guarded methods (handlers.py), the servicer, the llmserve.v1 codec
and TLS credentials (security.py). What both doors share stays in api/."""
