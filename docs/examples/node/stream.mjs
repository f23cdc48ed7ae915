// Streams a completion from a running llmserve over its public gRPC API.
//
//   npm ci --prefix docs/examples/node            # once: @grpc/grpc-js and @grpc/proto-loader
//   node docs/examples/node/stream.mjs "Once upon a time" --max-tokens 32
//   node docs/examples/node/stream.mjs "Say hello" --chat
//
// The API is loaded at run time from protos/llmserve/v1/llmserve.proto (no generated code).
// Address: --address, else LLMSERVE_ADDRESS, else 127.0.0.1:50051. A server started with an
// API key wants it in LLMSERVE_API_KEY (the environment, not a flag: flags show in ps); it is
// sent as "authorization: Bearer <key>". --tls (system roots) or --ca-cert ca.pem for a TLS
// server. --json prints every streamed message as one JSON line instead of the text.
// A failed call prints "error: <gRPC status name> (<code>): <details>" and exits 1.

import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const here = dirname(fileURLToPath(import.meta.url));
const PROTO_ROOT = join(here, "..", "..", "..");  // the repository root, where protos/ lives

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    address: { type: "string", default: process.env.LLMSERVE_ADDRESS || "127.0.0.1:50051" },
    "max-tokens": { type: "string", default: "64" },
    temperature: { type: "string", default: "0" },
    seed: { type: "string" },
    chat: { type: "boolean", default: false },
    json: { type: "boolean", default: false },
    tls: { type: "boolean", default: false },
    "ca-cert": { type: "string" },
    timeout: { type: "string", default: "600" },
    "proto-root": { type: "string", default: process.env.LLMSERVE_PROTO_ROOT || PROTO_ROOT },
    help: { type: "boolean", short: "h", default: false },
  },
});

if (opts.help) {
  console.log("usage: node stream.mjs [PROMPT] [--address HOST:PORT] [--max-tokens N] " +
    "[--temperature T] [--seed S] [--chat] [--json] [--tls | --ca-cert FILE] [--timeout S]\n" +
    "env: LLMSERVE_ADDRESS, LLMSERVE_API_KEY, LLMSERVE_PROTO_ROOT");
  process.exit(0);
}

// keepCase: the proto's own field names (max_tokens, token_ids); enums as their names.
const definition = protoLoader.loadSync("protos/llmserve/v1/llmserve.proto", {
  includeDirs: [opts["proto-root"]], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const { LLMServe } = grpc.loadPackageDefinition(definition).llmserve.v1;

function credentials() {
  if (opts["ca-cert"]) return grpc.credentials.createSsl(readFileSync(opts["ca-cert"]));
  return opts.tls ? grpc.credentials.createSsl() : grpc.credentials.createInsecure();
}

function request() {
  const prompt = positionals[0] ?? "Hello, world!";
  const params = { max_tokens: Number(opts["max-tokens"]), temperature: Number(opts.temperature) };
  if (opts.seed !== undefined) params.seed = opts.seed;  // uint64: a decimal string
  const input = opts.chat ? { chat: { messages: [{ role: "user", content: prompt }] } } : { text: prompt };
  return { ...input, params };
}

const statusName = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));
const client = new LLMServe(opts.address, credentials());
const metadata = new grpc.Metadata();
if (process.env.LLMSERVE_API_KEY) metadata.set("authorization", `Bearer ${process.env.LLMSERVE_API_KEY}`);
const deadline = new Date(Date.now() + Number(opts.timeout) * 1000);

const call = client.Generate(request(), metadata, { deadline });
process.on("SIGINT", () => call.cancel());  // Ctrl-C cancels the request on the server too

call.on("data", (msg) => {
  if (opts.json) {
    console.log(JSON.stringify({
      index: msg.index, token_ids: msg.token_ids, text: msg.text, finish_reason: msg.finish_reason,
      usage: msg.usage, matched_stop: msg.matched_stop,
    }));
    return;
  }
  process.stdout.write(msg.text);
  if (msg.finish_reason !== "FINISH_REASON_UNSPECIFIED") {
    const { prompt_tokens: p, completion_tokens: c } = msg.usage;
    process.stdout.write(`\n[${msg.finish_reason}: ${p} prompt + ${c} generated tokens]\n`);
  }
});
call.on("error", (err) => {
  console.error(`error: ${statusName[err.code] ?? "UNKNOWN"} (${err.code}): ${err.details}`);
  process.exitCode = 1;
  client.close();
});
call.on("end", () => client.close());
