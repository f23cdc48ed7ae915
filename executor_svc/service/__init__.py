"""Process and gRPC: the server, the servicer, the step pipeline, the stream slot."""
