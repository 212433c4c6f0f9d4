"""Mooncake traces (workloads/mooncake.py): Moonshot AI's request logs with their prompts' block hashes, imported
so that the requests a run sends share the blocks the log's requests shared."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.cli.app import app
from planner.cost.linear import LinearCostModel
from planner.sim import simulate
from planner.validation.run import validate
from planner.validation.spec import ValidationSpec
from sim_helpers import ConstantCost, sim_plan
from tiny_models import save_tiny_model
from workloads import Trace, TraceError, import_mooncake

# The two lines the Mooncake README shows (kvcache-ai/Mooncake, FAST25-release: they share 12 blocks), then three
# lines from the head of its conversation trace (later times), whose block 0 (a system prompt's) all three hold
README = [{"timestamp": 27482, "input_length": 6955, "output_length": 52,
           "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]},
          {"timestamp": 30535, "input_length": 6472, "output_length": 26,
           "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}]
AGENT = [{"timestamp": 40000, "input_length": 6758, "output_length": 500, "hash_ids": list(range(14))},
         {"timestamp": 41000, "input_length": 2290, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]},
         {"timestamp": 42000, "input_length": 7322, "output_length": 490, "hash_ids": [0, *range(14, 28)]}]


def write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def untimed_line(line):
    return {key: value for key, value in line.items() if key != "timestamp"}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_a_mooncake_trace_keeps_its_times_lengths_and_shared_blocks(tmp_path):
    trace = Trace.load(write(tmp_path / "mooncake.jsonl", README + AGENT))     # found by its keys
    assert trace == import_mooncake(tmp_path / "mooncake.jsonl")
    assert [r.arrival_time for r in trace] == [0.0, 3.053, 12.518, 13.518, 14.518]     # ms, from the first line
    assert [(r.prompt_len, r.output_len) for r in trace] == [(6955, 52), (6472, 26), (6758, 500), (2290, 316),
                                                             (7322, 490)]
    ids = [trace.prompt_token_ids(r, 32000) for r in trace]
    assert [len(p) for p in ids] == [r.prompt_len for r in trace]

    def common(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    # requests share exactly their common leading blocks, 512 tokens each
    assert common(ids[0], ids[1]) == 12 * 512
    assert common(ids[2], ids[3]) == common(ids[2], ids[4]) == common(ids[3], ids[4]) == 512
    assert common(ids[0], ids[2]) == 0
    # what an unbounded prefix cache would reuse: block 0 twice, and 12 blocks
    stats = trace.stats()
    assert stats["prefix_token_share"] == pytest.approx((12 * 512 + 2 * 512) / stats["total_prompt_tokens"])
    # and a CSV keeps the hashes
    assert Trace.load(trace.save(tmp_path / "kept.csv")).requests == trace.requests


def test_a_simulated_prefix_cache_hits_the_blocks_the_log_shared(tmp_path):
    # requests 10 s apart, each done before the next: a roomy cache hits every block an earlier request held
    lines = [dict(line, timestamp=10_000 * i) for i, line in enumerate(README + AGENT)]
    trace = Trace.load(write(tmp_path / "spaced.jsonl", lines))
    for policy in ("vllm-v1", "paper"):
        plan = sim_plan("llama-3.1-8b", "h100-sxm", policy=policy, enable_prefix_caching=True)
        result = simulate(trace, plan, LinearCostModel(0.01, 1e-4))
        assert result.prefix_cache_hit_tokens == 12 * 512 + 2 * 512
    # without the hashes the same lengths share nothing
    plain = Trace([r.model_copy(update={"hash_ids": None}) for r in trace])
    assert simulate(plain, sim_plan("llama-3.1-8b", "h100-sxm", enable_prefix_caching=True),
                    LinearCostModel(0.01, 1e-4)).prefix_cache_hit_tokens == 0


def test_scaled_blocks_keep_what_the_requests_share(tmp_path):
    # a CPU validation's --length-scale shrinks each block with its prompt: the requests still share their
    # common leading blocks, now of 16 tokens (512 / 32)
    trace = Trace.load(write(tmp_path / "mooncake.jsonl", README + AGENT)).scaled(length_scale=1 / 32,
                                                                                 max_prompt_len=200)
    assert {r.hash_block_size for r in trace} == {16}
    assert [r.prompt_len for r in trace] == [200, 200, 200, 72, 200]     # (6,955 / 32 = 217, capped at 200)
    assert [len(r.hash_ids) for r in trace] == [13, 13, 13, 5, 13]       # as many blocks as cover the prompt
    ids = [trace.prompt_token_ids(r, 32000) for r in trace]
    assert ids[0][:12 * 16] == ids[1][:12 * 16] and ids[0][12 * 16] != ids[1][12 * 16]
    assert ids[2][:16] == ids[3][:16] == ids[4][:16] and ids[2][16] != ids[3][16]


@pytest.mark.parametrize("line, problem", [
    ({"input_length": 600, "output_length": 5, "hash_ids": [1, 2], "session_id": 3}, r":1: session_id: not a Mooncake"),
    ({"output_length": 5}, r":1: input_length: missing"),
    ({"input_length": True, "output_length": 5}, r":1: input_length: must be a whole number of tokens, got true"),
    ({"input_length": 600, "output_length": 0}, r":1: output_length: must be >= 1, got 0 \(planner workload import "
                                                r"--format mooncake --drop-zero"),
    ({"input_length": 600, "output_length": 5, "hash_ids": [1]},
     r":1: hash_ids: has 1 block hash but a prompt of 600 tokens is 2 blocks of 512"),
    ({"input_length": 600, "output_length": 5, "hash_ids": "1 2"}, r":1: hash_ids: must be a list of block ids"),
    ({"input_length": 600, "output_length": 5, "hash_ids": [1, -2]}, r":1: hash_ids: holds a hash id that is negative"),
    ({"timestamp": "now", "input_length": 600, "output_length": 5}, r":1: timestamp: must be finite milliseconds >= 0"),
])
def test_a_broken_line_is_named_by_its_line_and_field(tmp_path, line, problem):
    path = write(tmp_path / "bad.jsonl", [line])
    with pytest.raises(TraceError, match=problem):
        import_mooncake(path)
    result = invoke("simulate", "--trace", path, "--out", tmp_path / "run")   # one line, no traceback
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len([w for w in result.output.splitlines() if w.strip()]) == 1


def test_timestamps_on_every_line_or_none_and_in_order(tmp_path):
    untimed = Trace.load(write(tmp_path / "untimed.jsonl", [untimed_line(line) for line in README]))
    assert [r.arrival_time for r in untimed] == [0.0, 0.0]           # (aiperf's replay without a schedule)
    with pytest.raises(TraceError, match=r":2: timestamp: missing \(the lines before have one\)"):
        import_mooncake(write(tmp_path / "half.jsonl", [README[0], untimed_line(README[1])]))
    with pytest.raises(TraceError, match=r":2: timestamp: the lines before have none"):
        import_mooncake(write(tmp_path / "late.jsonl", [untimed_line(README[0]), README[1]]))
    with pytest.raises(TraceError, match=r":2: timestamp: 100 is before the previous line's"):
        import_mooncake(write(tmp_path / "back.jsonl", [README[0], {**README[1], "timestamp": 100}]))


def test_workload_import_of_a_mooncake_trace(tmp_path):
    src = write(tmp_path / "tool.jsonl", README + [{"timestamp": 31000, "input_length": 9, "output_length": 0}])
    out = tmp_path / "trace.jsonl"
    refused = invoke("workload", "import", src, "--format", "mooncake", "-o", out)
    assert refused.exit_code == 2 and ":3: output_length: must be >= 1, got 0" in refused.output
    result = invoke("workload", "import", src, "--format", "mooncake", "--drop-zero", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["count"] == 2 and Trace.load(out).params["dropped_rows"] == 1
    # its blocks at another size (a trace hashed at 16 tokens a block)
    assert invoke("workload", "import", src, "--format", "mooncake", "--drop-zero", "--hash-block-size", "1024",
                  "-o", out).exit_code == 2                          # 14 hashes do not cover 6,955 tokens at 1,024
    wrong = invoke("workload", "import", src, "--format", "azure", "--hash-block-size", "16", "-o", out)
    assert wrong.exit_code == 2 and "--hash-block-size: not used with --format azure" in wrong.output
    huge = invoke("workload", "import", src, "--format", "mooncake", "--hash-block-size", 10 ** 11, "-o", out)
    assert huge.exit_code == 2 and "--hash-block-size: must be 1 to 1,048,576 tokens" in huge.output   # (not the file)


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
@pytest.mark.parametrize("hash_block, hits, warned", [
    (16, 14 * 16, None),                 # whole KV blocks of 8: the 14 shared hash blocks are all hit
    # 12 tokens: the README pair's 12 shared blocks are 144 tokens (18 KV blocks), block 0's 12 tokens one KV
    # block each time it is met again: 144 + 2 x 8 of the 168 tokens shared, and the warning says so
    (12, 144 + 2 * 8, "a prefix cache can hold 95% of the 168 prompt tokens they share")])
def test_the_live_engine_hits_the_blocks_the_simulator_hits(tmp_path, hash_block, hits, warned):
    # a log hashed at `hash_block` tokens a block (the shapes above, lengths x hash_block / 512): the live prefix
    # cache hits what the simulated one hits, step for step
    lines = [{"timestamp": 400 * i, "input_length": -(-line["input_length"] * hash_block // 512),
              "output_length": max(1, line["output_length"] // 32), "hash_ids": line["hash_ids"]}
             for i, line in enumerate(README + AGENT)]                      # in ceil(L / 512) blocks
    trace = import_mooncake(write(tmp_path / "small.jsonl", lines), block_size=hash_block)
    model = save_tiny_model("llama", tmp_path / "llama")
    deployment = Deployment(model=model, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=256,
                            enable_prefix_caching=True)
    saved = trace.save(tmp_path / "hashed.jsonl")
    spec = ValidationSpec(deployment, workload=str(saved), concurrency=1, requests=len(trace), length_scale=1.0,
                          max_prompt_len=240, max_output_len=15)      # (one client: the same steps at any speed)
    v = validate(spec, cost_model=ConstantCost())
    def steps(records):
        return [(s.batch_size, s.prefill_tokens, s.decode_tokens, s.kv_blocks_used) for s in records]
    assert steps(v.live.steps) == steps(v.sim_steps)
    # the live engine computed the prompts' tokens but for the whole KV blocks the log's requests shared
    assert sum(s.prefill_tokens for s in v.live.steps) == sum(r.prompt_len for r in trace) - hits
    assert v.simulated["prefix_cache_hit_tokens"] == hits
    assert [warned in w for w in v.warnings] == ([True] if warned else [])


def test_a_run_warns_of_hash_blocks_that_are_not_whole_kv_blocks(tmp_path):
    # requests 10 s apart, each done before the next (as above), the log's lengths / 40: blocks of 13 tokens.
    # The README pair's 12 shared blocks are 156 tokens, 9 whole KV blocks of 16 (144); block 0's 13 tokens
    # hold none: 144 of the 182 tokens shared can be hit, and the simulated cache hits just those
    lines = [dict(line, timestamp=10_000 * i) for i, line in enumerate(README + AGENT)]
    trace = Trace.load(write(tmp_path / "spaced.jsonl", lines)).scaled(length_scale=1 / 40)
    assert {r.hash_block_size for r in trace} == {13}
    saved = trace.save(tmp_path / "scaled.jsonl")
    result = invoke("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", saved, "--json",
                    "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["prefix_cache_hit_tokens"] == 144
    assert doc["warnings"] == ["the trace's prompts share blocks of 13 tokens (hash_block_size), not whole 16-token "
                               "KV blocks: a prefix cache can hold 79% of the 182 prompt tokens they share (hash "
                               "blocks of a multiple of 16 tokens would keep them all)"]
    assert "a prefix cache can hold 79%" in result.stderr                     # said before the run, too
    # hash blocks of whole KV blocks (lengths / 32: 16 tokens), or no prefix cache: nothing lost to warn of
    whole = Trace.load(write(tmp_path / "spaced.jsonl", lines)).scaled(length_scale=1 / 32).save(tmp_path / "16.jsonl")
    for workload, flags in ((whole, ()), (saved, ("--no-enable-prefix-caching",))):
        quiet = invoke("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", workload, "--json",
                       *flags, "--out", tmp_path / "quiet")
        assert quiet.exit_code == 0, quiet.output
        assert json.loads(quiet.stdout)["warnings"] == []
