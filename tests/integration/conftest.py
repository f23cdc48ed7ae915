import pytest
import torch

from executor_svc.model_loader.random_model import build_random_model
from benchmarks.cluster import Cluster

# The test clusters' CPU executors: 128 MiB of KV cache (16,384 blocks of the tiny llama, 8,192 of
# qwen3's; more than any test holds at once) instead of the executor's 1 GiB default, whose
# allocation took 1.2-2 s of every start (and a GiB of memory while the cluster lives). A test's
# own --cpu-kv-cache-gib or --num-kv-blocks, given after these, wins.
CPU_KV = ["--cpu-kv-cache-gib", "0.125"]
CPU_EXECUTOR = ["--device", "cpu", *CPU_KV]

@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """Tiny random models, one per architecture family, built once per session."""
    base = tmp_path_factory.mktemp("models")
    return {name: build_random_model(base / name, f"tiny-{name}", seed=i)
            for i, name in enumerate(["llama", "qwen2", "qwen3", "mistral"])}


@pytest.fixture(scope="session")
def hf_greedy(model_dirs):
    """Reference: transformers generate() on the same folder, greedy, float32."""
    import transformers

    models = {}

    def run(name: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        if name not in models:
            models[name] = transformers.AutoModelForCausalLM.from_pretrained(
                model_dirs[name], dtype=torch.float32).eval()
        ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = models[name].generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                        attention_mask=torch.ones_like(ids))
        return out[0, len(prompt_ids):].tolist()

    return run


def start_cluster(tmp_path_factory, model, name, executor_args=(), scheduler_args=(), http=False):
    return Cluster(model, tmp_path_factory.mktemp(f"logs-{name}"), [*CPU_EXECUTOR, *executor_args],
                   scheduler_args, http=http)


# The built-in model's cluster serves tool calls as the tool tests need (a request without tools
# is not changed by these flags).
TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


@pytest.fixture(scope="package")
def smollm2_cluster(smollm2_gguf, smollm2_cache_dir, smollm2_folder, tmp_path_factory):
    """Both services on the built-in SmolLM2-135M-Instruct, --model the .gguf file itself (the
    executor finds the session's conversion in --cache-dir), fp32, with the HTTP API and tool
    calling: one for the package (a start costs ~15 s on 2 cores), shared by the real-model,
    structured-output and tool-calling tests."""
    c = start_cluster(tmp_path_factory, smollm2_gguf, "smollm2", executor_args=[
        "--dtype", "float32", "--cache-dir", str(smollm2_cache_dir), "--num-kv-blocks", "1024"],
        scheduler_args=TOOL_FLAGS, http=True)
    yield c
    c.stop()


@pytest.fixture(scope="package")
def llama_cluster(model_dirs, tmp_path_factory):
    """Both services on the tiny llama, every flag at its default, one for the package (a start
    and a stop cost ~8 s on 2 cores): the modules that need no other flag share it. A test that
    restarts, stops or hangs a service, reads its log lines or measures its memory starts its own."""
    c = start_cluster(tmp_path_factory, model_dirs["llama"], "llama")
    yield c
    c.stop()
