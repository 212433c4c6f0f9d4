"""vLLM's multi-turn benchmark's conversations file imported turn by turn (workloads/conversations.py): each
user message a request whose prompt is the conversation so far in the chat template, whose output is the
answer's length, in conversations a closed loop sends one turn after another."""
from __future__ import annotations

import json

import pytest

from engine.deployment import Deployment
from planner.runs.spec import Load, RunSpec
from planner.runs.pipeline import Simulation
from workloads import Trace, TraceError, import_conversations

WORDS = ["[UNK]", "<u>", "<a>", "</t>"] + [f"w{i}" for i in range(50)]
TEMPLATE = ("{% for m in messages %}{{ '<u> ' if m['role'] == 'user' else '<a> ' }}{{ m['content'] }} </t> "
            "{% endfor %}{% if add_generation_prompt %}<a>{% endif %}")


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    """A word-level tokenizer with a chat template: <u> or <a> before each message, </t> after it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = TEMPLATE
    folder = tmp_path_factory.mktemp("chat-tokenizer")
    fast.save_pretrained(folder)
    return folder


def words(n: int, start: int = 0) -> str:
    return " ".join(f"w{(start + i) % 50}" for i in range(n))


def write(tmp_path, entries) -> str:
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(entries))
    return path


def openai(*texts):
    return {"id": "x", "messages": [{"role": ("user", "assistant")[k % 2], "content": t} for k, t in enumerate(texts)]}


def test_every_turn_is_a_request_of_the_conversation_so_far(tmp_path, chat_tokenizer):
    path = write(tmp_path, [
        openai(words(3), words(5), words(2), words(4)),                 # two turns
        {"id": "y", "conversations": [{"from": "gpt", "value": words(1)}, {"from": "human", "value": words(6)},
                                      {"from": "gpt", "value": words(2)}, {"from": "human", "value": words(1)}]},
        openai(words(2), words(1), words(3), words(2)) | {"messages": [{"role": "system", "content": "w1"}]},
    ])
    trace = import_conversations(path, chat_tokenizer)
    # conversation 0: <u> 3 words </t> <a>, then <u> 3 </t> <a> 5 </t> <u> 2 </t> <a>; the ShareGPT one: its
    # leading answer dropped and its last question (no answer) left out; the one with a system message skipped
    assert [(r.conversation_id, r.turn, r.prompt_len, r.output_len) for r in trace] == [
        ("conv-0", 0, 6, 5), ("conv-1", 0, 9, 2), ("conv-0", 1, 17, 4)]
    first, second = (r for r in trace if r.conversation_id == "conv-0")
    # the second turn's prompt holds the first's prompt and its answer: a prefix cache's hit
    assert second.prompt_token_ids[:first.prompt_len + first.output_len] == \
        first.prompt_token_ids + first.output_token_ids
    assert second.prefix_len == first.prompt_len + first.output_len and first.prefix_len == 0
    assert trace.params["skipped"] == 1 and trace.params["conversations"] == 2
    assert all(r.arrival_time == 0 for r in trace if r.turn == 0)        # rate inf: every conversation at once
    assert second.arrival_time > first.arrival_time                        # after its answer and a think time
    cut = import_conversations(path, chat_tokenizer, num_requests=2)       # the file's order: conv-0 first
    assert sorted((r.conversation_id, r.turn) for r in cut) == [("conv-0", 0), ("conv-0", 1)]
    # the benchmark's --max-turns counts messages: 1 or 2 send one question, 3 sends two
    for max_turns, turns in ((1, 1), (2, 1), (3, 2)):
        capped = import_conversations(path, chat_tokenizer, max_turns=max_turns)
        assert max(r.turn for r in capped if r.conversation_id == "conv-0") == turns - 1
    saved = tmp_path / "trace.jsonl"
    trace.save(saved)
    assert [r.prompt_token_ids for r in Trace.load(saved)] == [r.prompt_token_ids for r in trace]


def test_a_simulated_closed_loop_hits_the_history(tmp_path, chat_tokenizer):
    entries = [openai(*(words(20 + 3 * k + c, c) for k in range(8))) for c in range(6)]
    path = tmp_path / "trace.jsonl"
    trace = import_conversations(write(tmp_path, entries), chat_tokenizer)
    trace.save(path)
    spec = RunSpec(Deployment(model="llama-3.1-8b", gpu="h100-sxm", block_size=4, max_model_len=4096),
                   Load(str(path), concurrency=2), cost_model="linear:0.01,0.0001")
    result = Simulation.prepare(spec).simulate()
    assert result.metrics.num_completed == 24
    # a turn's history is its previous prompt and answer (the trace's answer ids, as the client sends back the
    # server's), cached: every token a turn shares with them is a hit, but for a block's rounding
    shared = sum(r.prefix_len for r in trace) / sum(r.prompt_len for r in trace)
    assert shared > 0.7 and result.prefix_cache_hit_rate == pytest.approx(shared, abs=0.02)


def test_bad_files_say_what_is_wrong(tmp_path, chat_tokenizer):
    with pytest.raises(TraceError, match="entry 0: expected an object with messages"):
        import_conversations(write(tmp_path, [{"id": 1}]), chat_tokenizer)
    with pytest.raises(TraceError, match="entry 0: messages: each message needs a string 'role' and 'content'"):
        import_conversations(write(tmp_path, [{"messages": [{"role": "user"}]}]), chat_tokenizer)
    with pytest.raises(TraceError, match="no conversation to import"):
        import_conversations(write(tmp_path, [openai(words(2))]), chat_tokenizer)
    with pytest.raises(TraceError, match="JSON Lines\\? a conversations file is one JSON list"):
        bad = tmp_path / "lines.json"
        bad.write_text('{"messages": []}\n{"messages": []}\n')
        import_conversations(bad, chat_tokenizer)
    plain = tmp_path / "plain"
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(chat_tokenizer)
    tok.chat_template = None
    tok.save_pretrained(plain)
    with pytest.raises(TraceError, match="no chat template"):
        import_conversations(write(tmp_path, [openai(words(2), words(2))]), plain)


def test_planner_workload_import_reads_conversations(tmp_path, chat_tokenizer):
    from typer.testing import CliRunner
    from planner.cli import app
    source = write(tmp_path, [openai(words(3), words(5), words(2), words(4)), openai(words(4), words(2))])
    out = tmp_path / "conv.jsonl"
    run = CliRunner().invoke(app, ["workload", "import", str(source), "--format", "conversations", "--tokenizer",
                                   str(chat_tokenizer), "-o", str(out), "--rate", "2", "--json"])
    assert run.exit_code == 0, run.output
    trace = Trace.load(out)
    assert sorted((r.conversation_id, r.turn) for r in trace) == [("conv-0", 0), ("conv-0", 1), ("conv-1", 0)]
    starts = sorted(r.arrival_time for r in trace if r.turn == 0)
    assert starts[0] == 0 < starts[1]                           # a rate: the conversations start apart
    refused = CliRunner().invoke(app, ["workload", "import", str(source), "--format", "conversations",
                                       "--tokenizer", str(chat_tokenizer), "-o", str(out), "--input-len", "9"])
    assert refused.exit_code != 0 and "--input-len: not used with --format conversations" in refused.output
    # the multi-turn benchmark's --limit-max-tokens: every answer 7 tokens, in its request and in the history
    limited = CliRunner().invoke(app, ["workload", "import", str(source), "--format", "conversations",
                                       "--tokenizer", str(chat_tokenizer), "-o", str(out), "--output-len", "7"])
    assert limited.exit_code == 0, limited.output
    first, second, _ = sorted(Trace.load(out), key=lambda r: (r.conversation_id, r.turn))
    assert first.output_len == second.output_len == len(first.output_token_ids) == 7
    # conversation 0: <u> 3 words </t> <a>, then that, 7 answer words (the answer's 5, cycled), </t> <u> 2 </t> <a>
    assert second.prompt_len == 6 + 7 + 6 and second.prefix_len == first.prompt_len + 7
    untokenized = CliRunner().invoke(app, ["workload", "import", str(source), "--format", "conversations",
                                           "-o", str(out)])
    assert untokenized.exit_code != 0 and "--tokenizer: a conversations file holds text" in untokenized.output


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_live_turns_send_back_the_live_answers_as_the_simulated_ones_the_traces(tmp_path, chat_tokenizer):
    # The live model's answer takes the trace's place in the next turn's history (as the benchmark sends the
    # server's answer back), so the live prefix cache hits it as the simulated one hits the trace's: the same
    # batches, prefill tokens and blocks step for step, with two clients of two conversations each.
    from planner.validation.run import validate
    from planner.validation.spec import ValidationSpec
    from sim_helpers import ConstantCost
    from tiny_models import save_tiny_model
    entries = [openai(*(words(10 + 2 * k + c, c) for k in range(6))) for c in range(4)]
    path = tmp_path / "trace.jsonl"
    trace = import_conversations(write(tmp_path, entries), chat_tokenizer)
    trace.save(path)
    deployment = Deployment(model=save_tiny_model("llama", tmp_path / "llama"), gpu="cpu", block_size=8,
                            max_num_seqs=8, max_model_len=128, enable_prefix_caching=True,
                            max_active_conversations=4)
    spec = ValidationSpec(deployment, workload=str(path), concurrency=2, requests=len(trace), seeds=0,
                          length_scale=1.0)
    v = validate(spec, cost_model=ConstantCost())
    # each client's second conversation has one turn left when it finds none to take and stops (the benchmark's
    # rule): 10 of the 12 turns sent, live and simulated
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == 10

    def steps(records):
        return [(s.batch_size, s.prefill_tokens, s.decode_tokens, s.kv_blocks_used) for s in records]
    assert steps(v.live.steps) == steps(v.sim_steps)
    computed = sum(s.prefill_tokens for s in v.live.steps)
    assert computed < sum(r.prompt_len for r in trace) - sum(r.prefix_len for r in trace) // 2   # the history hit


def test_from_vllm_runs_the_multi_turn_benchmarks_line(tmp_path, chat_tokenizer, monkeypatch):
    # `planner from-vllm --run` imports the benchmark's input (its --model the tokenizer), then simulates
    from typer.testing import CliRunner
    from planner.cli import app
    monkeypatch.chdir(tmp_path)
    write(tmp_path, [openai(*(words(8 + k + c, c) for k in range(6))) for c in range(4)])
    bench = f"python benchmark_serving_multi_turn.py -m {chat_tokenizer} -i conversations.json -p 2 -k 4 " \
            f"--no-early-stop"
    run = CliRunner().invoke(app, ["from-vllm", "--serve", "vllm serve meta-llama/Llama-3.1-8B-Instruct", "--gpu",
                                   "h100-sxm", "--bench", bench, "--run", "--", "--json", "--out", str(tmp_path / "r")])
    assert run.exit_code == 0, run.output
    assert "planner workload import conversations.json --format conversations" in run.stderr
    doc = json.loads(run.stdout)
    assert doc["num_completed"] == 10 and (tmp_path / "conversations-turns.jsonl").is_file()   # as above
    missing = CliRunner().invoke(app, ["from-vllm", "--serve", "vllm serve meta-llama/Llama-3.1-8B-Instruct",
                                       "--gpu", "h100-sxm", "--bench", bench.replace("conversations.json", "no.json"),
                                       "--run"])
    assert missing.exit_code == 2 and "no.json: no such file" in missing.output
