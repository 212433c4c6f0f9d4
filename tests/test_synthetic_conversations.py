"""vLLM's multi-turn benchmark's generation config (workloads/synthetic_conversations.py): the benchmark's
own conversations, drawn from the same seed, imported turn by turn and sent by the same clients."""
from __future__ import annotations

import json
import random
import statistics

import pytest

from engine.deployment import Deployment
from planner.runs.pipeline import Simulation
from planner.runs.spec import Load, RunSpec
from workloads import TraceError, import_conversations

# vLLM's benchmarks/multi_turn/generate_multi_turn.json, as published
EXAMPLE = {
    "filetype": "generate_conversations", "num_conversations": 24, "text_files": ["book.txt"], "print_stats": False,
    "prompt_input": {"num_turns": {"distribution": "uniform", "min": 12, "max": 18},
                     "common_prefix_num_tokens": {"distribution": "constant", "value": 500},
                     "prefix_num_tokens": {"distribution": "lognormal", "average": 1000, "max": 5000},
                     "num_tokens": {"distribution": "uniform", "min": 120, "max": 160}},
    "prompt_output": {"num_tokens": {"distribution": "uniform", "min": 80, "max": 120}},
}
WORDS = ["the", "count", "of", "monte", "cristo", "said", "and", "a", "to", "he", "was", "in", "his", "that", "ship",
         "sea", "old", "man", "letter", "father", "prison", "island", "treasure", "night", "Marseilles", "Edmond"]


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """A folder with a text of about 100,000 tokens and a byte-level BPE chat tokenizer trained on it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("book")
    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))).capitalize() + rng.choice(".,!?")
             for _ in range(6000)]
    (folder / "book.txt").write_text("\n".join(lines))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(folder / "book.txt")],
              trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(folder / "tok")
    return folder


def config(folder, **changes):
    path = folder / "generate.json"
    path.write_text(json.dumps(EXAMPLE | changes))
    return path


def test_the_benchmarks_own_example_run(book, tmp_path):
    # vLLM's benchmarks/multi_turn/README.md prints its example's requests (generate_multi_turn.json, seed 0,
    # --num-clients 2 --max-active-conversations 6, early stop): 166 of them; input_num_turns mean 7.43, std
    # 4.57, quartiles 3, 7, 11, max 17; output_num_tokens mean 100.01, std 11.80, min 80, median 99. Those
    # depend on the seed's draws and the clients' rules alone, not on the tokenizer or the text.
    trace = import_conversations(config(book), book / "tok")
    assert trace.params["generated"] and trace.params["conversations"] == 24
    path = tmp_path / "turns.jsonl"
    trace.save(path)
    spec = RunSpec(Deployment(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=8192, max_active_conversations=6,
                              client_early_stop=True, client_turnaround=0.001),
                   Load(str(path), concurrency=2), cost_model="linear:0.01,0.0001")
    result = Simulation.prepare(spec).simulate()
    sent = [r for r in result.requests if r.finish is not None]
    messages = sorted(2 * int(r.request_id.rsplit("-", 1)[1]) + 1 for r in sent)   # the question's, history's
    outputs = sorted(r.output_len for r in sent)
    assert len(sent) == result.metrics.num_completed == 166
    assert (round(statistics.mean(messages), 2), round(statistics.stdev(messages), 2)) == (7.43, 4.57)
    assert statistics.quantiles(messages, n=4) == [3, 7, 11] and messages[-1] == 17
    assert (round(statistics.mean(outputs), 2), round(statistics.stdev(outputs), 2)) == (100.01, 11.80)
    assert (outputs[0], statistics.median(outputs), outputs[-1]) == (80, 99, 120)


def test_messages_are_built_as_the_benchmark_builds_them(book):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(book / "tok")
    text = tok.encode((book / "book.txt").read_text(), add_special_tokens=False)
    trace = import_conversations(config(book), book / "tok")
    by_conv = {}
    for r in trace:
        by_conv.setdefault(r.conversation_id, []).append(r)
    # 12-18 messages drawn, so 6-9 questions a conversation; every answer the text's first tokens, 80-120
    assert all(6 <= len(turns) <= 9 for turns in by_conv.values())
    answers = [r.output_token_ids for r in trace]
    assert all(80 <= len(a) <= 120 and a == tok.encode(tok.decode(text[:len(a)]), add_special_tokens=False)
               for a in answers)
    # every first turn opens with the common prefix (500 tokens of the text, cut 2 short, then "."), so a
    # prefix cache shares it across conversations; the conversation's number keeps the rest its own
    common = tok.decode(text[:498]) + "."
    firsts = [tok.decode(turns[0].prompt_token_ids) for turns in by_conv.values()]
    assert all(f"<|user|>{common}{i} is a nice number... {i}, " in first for i, first in enumerate(firsts))
    # a later question: its number, the instruction, then text up to its drawn 120-160 tokens (re-tokenized
    # text may merge a token or two at the seams)
    later = [r for r in trace if r.turn > 0]
    for r in later:
        history = r.prompt_token_ids[:r.prefix_len]
        question = tok.decode(r.prompt_token_ids[r.prefix_len:])
        assert len(history) > 700 and "is a nice number... Please rewrite the following text" in question
        assert 115 <= len(tok.encode(question.split("<|user|>")[-1].split("<|end|>")[0],
                                     add_special_tokens=False)) <= 160
    # the conversations' own prefixes: lognormal draws scaled to a mean of 1,000 tokens
    assert 1400 < statistics.mean(turns[0].prompt_len for turns in by_conv.values()) < 1900
    # the seed decides the draws: another seed, other conversations; the same seed, the same
    assert [r.prompt_token_ids for r in import_conversations(config(book), book / "tok")] == \
        [r.prompt_token_ids for r in trace]
    other = import_conversations(config(book), book / "tok", seed=1)
    assert [len(t) for t in by_conv.values()] != \
        [sum(r.conversation_id == c for r in other) for c in by_conv]


def test_draws_come_in_the_benchmarks_order_from_its_seed(book):
    # bench_dataset.py draws, from numpy's generator seeded by --seed: every conversation's message count,
    # then every conversation's own prefix, then the common prefix; a lognormal given its average is scaled so
    # its draws' mean is that average; each conversation's prefix is the text after the common prefix and the
    # prefixes before it, moved on by each conversation's message count
    import numpy as np
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(book / "tok")
    text = tok.encode((book / "book.txt").read_text(), add_special_tokens=False)
    changes = {"num_conversations": 5, "prompt_input": {
        "num_turns": {"distribution": "zipf", "alpha": 2.0, "max": 9},
        "common_prefix_num_tokens": {"distribution": "uniform", "min": 50, "max": 90},
        "prefix_num_tokens": {"distribution": "lognormal", "average": 120},
        "num_tokens": {"distribution": "uniform", "min": 20, "max": 30}},
        "prompt_output": {"num_tokens": {"distribution": "poisson", "alpha": 10}}}
    trace = import_conversations(config(book, **changes), book / "tok", seed=4)
    rng = np.random.RandomState(4)
    messages = np.maximum(np.minimum(rng.zipf(2.0, 5), 9), 2)
    messages += messages % 2
    prefixes = rng.lognormal(np.log(120 * 0.85), np.sqrt(2 * np.log(1 / 0.85)), 5)
    prefixes = np.round(prefixes * 120 / prefixes.mean()).astype(int)
    common = int(rng.randint(50, 91))
    offset = common
    for i in range(5):
        turns = sorted((r for r in trace if r.conversation_id == f"conv-{i}"), key=lambda r: r.turn)
        assert len(turns) == messages[i] // 2
        first = tok.decode(turns[0].prompt_token_ids)
        assert f"{tok.decode(text[:common - 2])}.{i} is a nice number... {i}, " \
               f"{tok.decode(text[offset:offset + prefixes[i]])}Please rewrite" in first
        offset += prefixes[i] + messages[i]


@pytest.mark.parametrize("changes, message", [
    ({"filetype": "other"}, "filetype: the multi-turn benchmark generates 'generate_conversations', got 'other'"),
    ({"num_conversations": 0}, "num_conversations: expected a whole number >= 1, got 0"),
    ({"text_files": []}, "text_files: expected a list of at least one file name"),
    ({"text_files": ["none.txt"]}, "text_files: none.txt: no such file"),
    ({"prompt_output": {}}, "prompt_output: num_tokens: missing"),
    ({"prompt_output": {"num_tokens": {"distribution": "normal"}}},
     "prompt_output.num_tokens: distribution: expected one of constant, uniform, lognormal, zipf, poisson"),
    ({"prompt_output": {"num_tokens": {"distribution": "uniform", "min": 0, "max": 5}}},
     "prompt_output.num_tokens: min: must be a whole number > 0, got 0"),
    ({"prompt_output": {"num_tokens": {"distribution": "uniform", "min": 9, "max": 5}}},
     r"max: must be a whole number >= min \(9\), got 5"),
    ({"prompt_output": {"num_tokens": {"distribution": "zipf", "alpha": 1}}}, "alpha: must be > 1, got 1"),
    ({"prompt_output": {"num_tokens": {"distribution": "lognormal", "average": 9, "sigma": 1}}},
     "lognormal takes 'average'"),
    ({"prompt_output": {"num_tokens": {"distribution": "lognormal", "mean": 3}}}, "lognormal needs 'sigma'"),
    ({"prompt_output": {"num_tokens": {"distribution": "constant", "value": "9"}}},
     "value: must be a whole number >= 0, got '9'"),
    ({"prompt_output": {"num_tokens": {"distribution": "constant", "value": 10 ** 6}}},
     "too few for an answer of 1000000: give a longer text"),
    # were numpy's errors naming no field, and a lognormal's infinity cast to a negative length
    ({"prompt_output": {"num_tokens": {"distribution": "poisson", "alpha": 1e300}}},
     r"prompt_output.num_tokens: alpha: 1e\+300 is over the cap of 10,000,000"),
    ({"prompt_output": {"num_tokens": {"distribution": "uniform", "min": 1, "max": 1e300}}},
     r"max: 1e\+300 is over the cap"),
    ({"prompt_output": {"num_tokens": {"distribution": "lognormal", "mean": 1000, "sigma": 0}}},
     r"prompt_output.num_tokens: a lognormal draw of inf, over the cap of 10,000,000: give smaller parameters"),
])
def test_bad_configs_say_what_is_wrong(book, changes, message):
    with pytest.raises(TraceError, match=message):
        import_conversations(config(book, **changes), book / "tok")


def test_planner_imports_a_config_and_from_vllm_runs_its_line(book, monkeypatch):
    from typer.testing import CliRunner
    from planner.cli import app
    monkeypatch.chdir(book)
    config(book, num_conversations=4)
    bench = f"python benchmark_serving_multi_turn.py -m {book / 'tok'} -i generate.json -p 2 -k 4 --seed 3"
    run = CliRunner().invoke(app, ["from-vllm", "--serve", "vllm serve meta-llama/Llama-3.1-8B-Instruct", "--gpu",
                                   "h100-sxm", "--bench", bench, "--run", "--", "--json", "--out", str(book / "r")])
    assert run.exit_code == 0, run.output
    assert "--seed 3 -o generate-turns.jsonl" in run.stderr
    seeded = import_conversations(book / "generate.json", book / "tok", seed=3)
    assert json.loads(run.stdout)["num_submitted"] <= len(seeded)
    short = book / "short.txt"
    short.write_text("Too short a text.")
    config(book, text_files=[str(short)])
    refused = CliRunner().invoke(app, ["workload", "import", "generate.json", "--format", "conversations",
                                       "--tokenizer", str(book / "tok"), "-o", "x.jsonl"])
    assert refused.exit_code != 0 and "too few for" in refused.output and "Traceback" not in refused.output
