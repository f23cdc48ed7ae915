"""Tool calling on /v1/chat/completions (docs/api.md, "Tool calling"): the request's tools
checked and planned (plan.py), rendered into the prompt (render.py), the model's calls parsed
from its text as it streams (one module per format: hermes.py, llama3_json.py; forced.py for
the calls a grammar forces), and written back in OpenAI's shapes (response.py). No grpc, no
torch; imported by the HTTP door only."""
