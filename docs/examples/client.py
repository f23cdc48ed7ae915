"""Streams a completion from a running llmserve (python docs/examples/client.py "Once upon a time")."""

import argparse
import sys

import grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("prompt", nargs="?", default="Hello, world!")
    p.add_argument("--address", default="127.0.0.1:50051")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--chat", action="store_true", help="send the prompt as one user chat message")
    args = p.parse_args()

    params = pb.SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    if args.chat:
        chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=args.prompt)])
        request = pb.GenerateRequest(chat=chat, params=params)
    else:
        request = pb.GenerateRequest(text=args.prompt, params=params)
    with grpc.insecure_channel(args.address) as channel:
        stub = pb_grpc.LLMServeStub(channel)
        for msg in stub.Generate(request):
            sys.stdout.write(msg.text)
            sys.stdout.flush()
            if msg.finish_reason:
                reason = pb.FinishReason.Name(msg.finish_reason)
                print(f"\n[{reason}: {msg.usage.prompt_tokens} prompt + "
                      f"{msg.usage.completion_tokens} generated tokens]")


if __name__ == "__main__":
    main()
