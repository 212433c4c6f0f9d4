"""Importers on small files the tests write: ShareGPT JSON (+ a tiny tokenizer) and CSV traces."""

import json
import random

import pytest

from workloads import TraceError, import_csv_trace, import_custom, import_sharegpt, make_trace

WORDS = ["[UNK]"] + [f"w{i}" for i in range(50)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A word-level tokenizer saved as a local folder: one token per word, no specials added."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


def text(n, start=0):
    return " ".join(f"w{(start + i) % 50}" for i in range(n))


def sharegpt_file(tmp_path, pairs, extra=()):
    data = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": a}]}
        for i, (p, a) in enumerate(pairs)
    ]
    data.extend(extra)
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_follows_vllm_sampling(tmp_path, tokenizer_dir):
    # (prompt words, answer words); the filter keeps only the first four
    good = [(5, 9), (12, 4), (4, 30), (1024, 1024)]
    bad = [(3, 10), (10, 3), (1025, 5), (1000, 1049)]
    pairs = [(text(p, i), text(a, i + 7)) for i, (p, a) in enumerate(good + bad)]
    single_turn = {"id": "x", "conversations": [{"from": "human", "value": text(10)}]}
    path = sharegpt_file(tmp_path, pairs, extra=[single_turn])

    trace = import_sharegpt(path, tokenizer_dir, num_requests=100, seed=3, oversample=False)
    assert trace.params["available"] == 4
    assert sorted((r.prompt_len, r.output_len) for r in trace) == sorted(good)
    # the order is the one vLLM's seeded shuffle gives
    expected = [(p, a) for p, a in good + bad]
    random.Random(3).shuffle(expected)
    assert [(r.prompt_len, r.output_len) for r in trace] == [x for x in expected if x in good]
    first = trace[0]
    assert first.prompt_token_ids == [WORDS.index(w) for w in pairs[(good + bad).index(expected[0])][0].split()]
    # the answer's ids are kept too (n-gram speculation is measured on them: planner profile --speculative)
    assert first.output_token_ids == [WORDS.index(w) for w in pairs[(good + bad).index(expected[0])][1].split()]
    assert all(r.arrival_time == 0.0 for r in trace)

    few = import_sharegpt(path, tokenizer_dir, num_requests=2, seed=3, rate=2.0, keep_token_ids=False)
    assert [r.prompt_len for r in few] == [r.prompt_len for r in trace][:2]
    assert few[0].prompt_token_ids is None and few[1].arrival_time > 0
    fixed = import_sharegpt(path, tokenizer_dir, num_requests=100, seed=3, fixed_output_len=16, oversample=False)
    assert {r.output_len for r in fixed} == {16} and len(fixed) == 6  # (10, 3) and (1000, 1049) now pass
    assert all(r.output_token_ids is None for r in fixed)      # the output is not the answer's


def test_too_few_requests_are_oversampled_as_vllm_bench_does(tmp_path, tokenizer_dir):
    # vLLM's maybe_oversample_requests: random.seed(seed), then random.choice of the kept requests for each one
    # short; the copies are new requests with the same prompt (the prefix cache serves them again)
    pairs = [(text(5 + i, i), text(6 + i)) for i in range(5)]
    path = sharegpt_file(tmp_path, pairs)
    kept = import_sharegpt(path, tokenizer_dir, num_requests=12, seed=4, oversample=False)
    full = import_sharegpt(path, tokenizer_dir, num_requests=12, seed=4)
    assert len(kept) == 5 and len(full) == 12 and full.params["available"] == 5
    assert full.requests[:5] == kept.requests
    draw = random.Random(4)
    copies = [draw.choice(kept.requests) for _ in range(7)]
    assert [r.prompt_token_ids for r in full.requests[5:]] == [r.prompt_token_ids for r in copies]
    assert len({r.request_id for r in full}) == 12


def custom_file(tmp_path, prompts, name="prompts.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def test_custom_follows_vllm_benchs_custom_dataset(tmp_path, tokenizer_dir):
    # vllm/benchmarks/datasets/custom.py: shuffled by the seed, chat template unless skipped, --custom-output-len
    prompts = [text(3 + i, i) for i in range(6)]
    path = custom_file(tmp_path, prompts)
    plain = import_custom(path, tokenizer_dir, num_requests=4, seed=2, skip_chat_template=True)
    order = list(prompts)
    random.Random(2).shuffle(order)
    assert [r.prompt_len for r in plain] == [len(p.split()) for p in order[:4]]
    assert {r.output_len for r in plain} == {256} and plain.params["available"] == 4
    with pytest.raises(TraceError, match="has no chat template .* give --skip-chat-template"):
        import_custom(path, tokenizer_dir, num_requests=4)
    templated_dir = tmp_path / "templated"
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = ("w49 {% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %} w48{% endif %}")
    tok.save_pretrained(templated_dir)
    chat = import_custom(path, templated_dir, num_requests=4, seed=2, output_len=32)
    assert [r.prompt_len for r in chat] == [r.prompt_len + 2 for r in plain]      # the template's two words
    assert chat[0].prompt_token_ids[0] == WORDS.index("w49") and {r.output_len for r in chat} == {32}
    assert len(import_custom(path, templated_dir, num_requests=9, seed=2)) == 9           # oversampled
    in_order = import_custom(path, tokenizer_dir, num_requests=6, skip_chat_template=True, shuffle=False)
    assert [r.prompt_len for r in in_order] == [len(p.split()) for p in prompts]          # --disable-shuffle
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w1"}\n{"text": "w2"}\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: field 'prompt' is missing or not a string"):
        import_custom(bad, tokenizer_dir, num_requests=2, skip_chat_template=True)


def test_sharegpt_errors(tmp_path, tokenizer_dir):
    bad_json = tmp_path / "broken.json"
    bad_json.write_text('[{"conversations": [}\n')
    with pytest.raises(TraceError, match=r"broken\.json:1: invalid JSON"):
        import_sharegpt(bad_json, tokenizer_dir, num_requests=1)
    no_conv = tmp_path / "noconv.json"
    no_conv.write_text(json.dumps([{"id": "a"}]))
    with pytest.raises(TraceError, match=r"entry 0: conversations"):
        import_sharegpt(no_conv, tokenizer_dir, num_requests=1)
    path = sharegpt_file(tmp_path, [(text(5), text(5))])
    with pytest.raises(TraceError, match="tokenizer folder not found"):
        import_sharegpt(path, tmp_path / "nowhere", num_requests=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=r"empty: no tokenizer in it \(none of tokenizer\.json, "):
        import_sharegpt(path, tmp_path / "empty", num_requests=1)


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,879,55
2023-11-16 18:16:06.4205120,91,16
"""


def test_azure_layout(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(AZURE)
    trace = import_csv_trace(path)
    assert [r.arrival_time for r in trace] == [0.0, 4.314579, 4.31941, 19.739922]
    assert [(r.prompt_len, r.output_len) for r in trace] == [(374, 44), (396, 109), (879, 55), (91, 16)]
    assert trace[0].request_id == "AzureLLMInferenceTrace_conv-0"
    assert len(import_csv_trace(path, num_requests=2)) == 2
    assert len(import_csv_trace(path, duration=5.0)) == 3


def test_configurable_columns_and_seconds(tmp_path):
    path = tmp_path / "prod.csv"
    path.write_text("ts,in,out,model\n100.5,10,20,a\n101.0,11,21,b\n101.0,0,5,c\n103.25,12,22,d\n")
    with pytest.raises(TraceError, match=r"prod\.csv:4: in: length must be >= 1, got 0"):
        import_csv_trace(path, "ts", "in", "out")
    trace = import_csv_trace(path, timestamp_col="ts", prompt_col="in", output_col="out", drop_zero=True)
    assert [r.arrival_time for r in trace] == [0.0, 0.5, 2.75]
    assert trace.params["dropped_rows"] == 1
    # the imported trace saves and reloads like any other
    assert type(trace).load(trace.save(tmp_path / "prod.jsonl")) == trace


@pytest.mark.parametrize(
    "body,pattern",
    [
        ("TIMESTAMP,ContextTokens\n1,2\n", r"bad\.csv:1: GeneratedTokens: missing column"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n2,-5,3\n", r"bad\.csv:3: ContextTokens: length must be >= 1, got -5"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n5,2,3\n4,2,3\n", r"bad\.csv:3: TIMESTAMP: 4 is before"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,2,3\n", r"bad\.csv:2: TIMESTAMP: not seconds or a date-time"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2.5,3\n", r"bad\.csv:2: ContextTokens: not a whole number"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,\n", r"bad\.csv:2: GeneratedTokens: empty cell"),
    ],
)
def test_csv_errors(tmp_path, body, pattern):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=pattern):
        import_csv_trace(path)


def test_trace_file_as_workload_name(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    saved = import_csv_trace(path).save(tmp_path / "azure.jsonl")
    kept = make_trace(str(saved))
    assert [r.arrival_time for r in kept] == [0.0, 4.314579, 4.31941, 19.739922]
    retimed = make_trace(str(saved), rate=1.0, arrival="constant", num_requests=3)
    assert [r.arrival_time for r in retimed] == [0.0, 1.0, 2.0]
