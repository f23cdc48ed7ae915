"""Both services as processes: Detokenize and include_stop_str_in_output (issue 10)."""

import grpc
import pytest

from protos.llmserve.v1 import llmserve_pb2 as pb
from benchmarks.cluster import generate


@pytest.fixture(scope="module")
def cluster(llama_cluster):
    return llama_cluster  # the package's: every flag at its default (tests/integration/conftest.py)


def test_detokenize_round_trips_tokenize(cluster):
    text = "Hello world, the quick brown fox"
    ids = list(cluster.stub.Tokenize(pb.TokenizeRequest(text=text)).token_ids)
    out = cluster.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids), timeout=30)
    assert out.text.strip() == text
    kept = cluster.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids, skip_special_tokens=False),
                                   timeout=30)
    bos = cluster.stub.Tokenize(pb.TokenizeRequest(text=text)).tokens[0]
    assert kept.text.startswith(bos) and not out.text.startswith(bos)
    long_ids = list(cluster.stub.Tokenize(pb.TokenizeRequest(text=text * 40)).token_ids)
    assert len(long_ids) > 256  # decoded by a pool worker, not on the loop
    long = cluster.stub.Detokenize(pb.DetokenizeRequest(token_ids=long_ids), timeout=30)
    assert long.text.strip() == text * 40


def test_malformed_detokenize_bytes_are_invalid_argument(cluster):
    call = cluster.channel.unary_unary("/llmserve.v1.LLMServe/Detokenize")
    with pytest.raises(grpc.RpcError) as err:
        call(b"\x0a\xff", timeout=30)  # a packed field longer than the message
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("ids,needle", [([5, 512], "512"), ([-3, 5], "-3"), ([5] * 2049, "context")])
def test_detokenize_refuses_bad_ids(cluster, ids, needle):
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()


def test_include_stop_str_in_output(cluster):
    stub = cluster.stub
    _, text, _ = generate(stub, text="Hello", max_tokens=24, temperature=0.0, ignore_eos=True)
    assert len(text) > 6
    stop = text[3:6]
    end = text.index(stop) + len(stop)
    _, kept, last = generate(stub, text="Hello", max_tokens=24, temperature=0.0, ignore_eos=True,
                             stop=[stop], include_stop_str_in_output=True)
    assert kept == text[:end]
    assert last.finish_reason == pb.FINISH_REASON_STOP and last.matched_stop == stop
    _, cut, _ = generate(stub, text="Hello", max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    assert cut == text[: text.index(stop)]
