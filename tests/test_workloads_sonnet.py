"""vLLM bench's sonnet dataset: poem lines behind a shared prefix, in the tokenizer's chat template."""

import os
import random

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from workloads import Trace, TraceError, import_sonnet
from workloads.importers import SONNET_BASE_PROMPT

WORDS = ["[UNK]", "<user>", "<assistant>"] + [f"w{i}" for i in range(60)]
TEMPLATE = "{% for m in messages %}<user> {{ m['content'] }}{% endfor %}<assistant>"


def word_tokenizer(folder, chat_template=TEMPLATE):
    """A word-level tokenizer saved as a local folder (one token per word, no specials added)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def poem(tmp_path):
    draw = random.Random(3)
    path = tmp_path / "sonnet.txt"
    path.write_text("".join(" ".join(f"w{draw.randrange(60)}" for _ in range(draw.randint(5, 9))) + "\n"
                            for _ in range(40)))
    return path


def test_prompts_share_the_files_first_lines_and_fit_the_input_length(poem, tokenizer_dir):
    trace = import_sonnet(poem, tokenizer_dir, 50, seed=1, input_len=120, output_len=30, prefix_len=60, rate=5.0)
    lines = poem.read_text().splitlines(keepends=True)
    prefix_lines = trace.params["prefix_lines"]
    mean = sum(len(line.split()) for line in lines) / len(lines)
    base = len(f"<user> {SONNET_BASE_PROMPT}<assistant>".split())
    assert prefix_lines == max(round((60 - base) / mean), 0) > 0
    shared = ["<user>", *SONNET_BASE_PROMPT.split(), *"".join(lines[:prefix_lines]).split()]
    vocab = {w: i for i, w in enumerate(WORDS)}
    shared_ids = [vocab.get(w, 0) for w in shared]
    assert len(trace) == 50
    for r in trace:
        assert r.prompt_token_ids[:len(shared_ids)] == shared_ids       # what the prefix cache serves
        assert r.prompt_len == len(r.prompt_token_ids) <= 120 and r.output_len == 30
        assert r.prompt_token_ids[-1] == vocab["<assistant>"]
    assert len({tuple(r.prompt_token_ids) for r in trace}) > 40        # the drawn lines differ
    again = import_sonnet(poem, tokenizer_dir, 50, seed=1, input_len=120, output_len=30, prefix_len=60, rate=5.0)
    other = import_sonnet(poem, tokenizer_dir, 50, seed=2, input_len=120, output_len=30, prefix_len=60, rate=5.0)
    assert [r.prompt_token_ids for r in again] == [r.prompt_token_ids for r in trace]
    assert [r.prompt_token_ids for r in other] != [r.prompt_token_ids for r in trace]


def test_the_shared_prefix_is_served_from_the_prefix_cache(poem, tokenizer_dir, tmp_path):
    from planner import simulate
    from engine.deployment import Deployment

    trace = import_sonnet(poem, tokenizer_dir, 60, input_len=200, prefix_len=150, rate=4.0)
    path = tmp_path / "sonnet.jsonl"
    trace.save(path)
    doc = simulate(Deployment(model="llama-3.1-8b", gpu="h100-sxm", block_size=16), workload=str(path)).document()
    shared = len(os.path.commonprefix([r.prompt_token_ids for r in trace]))
    assert shared >= 100
    # every request but the first finds the shared prefix's full blocks cached
    assert doc["prefix_cache_hit_tokens"] >= 59 * (shared // 16) * 16


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(input_len=10), r"input_len: 10 tokens leave no room after the base prompt's 13"),
    (dict(input_len=40, prefix_len=400), r"0 of 3 prompts fit in input_len 40 after 3,000 draws"),
    (dict(output_len=0), r"output_len: must be 1 to 10,000,000 tokens, got 0"),
])
def test_refusals(poem, tokenizer_dir, kwargs, pattern):
    with pytest.raises(TraceError, match=pattern):
        import_sonnet(poem, tokenizer_dir, 3, **kwargs)


def test_a_tokenizer_without_a_chat_template_is_refused(poem, tmp_path):
    with pytest.raises(TraceError, match="no chat template; vLLM bench's sonnet dataset puts every prompt in one"):
        import_sonnet(poem, word_tokenizer(tmp_path / "plain", chat_template=None), 3)


def test_cli(poem, tokenizer_dir, tmp_path):
    out = tmp_path / "t.jsonl"
    base = ["workload", "import", str(poem), "--format", "sonnet", "-o", str(out)]
    result = CliRunner().invoke(app, [*base, "--tokenizer", str(tokenizer_dir), "-n", "20", "--input-len", "100",
                                      "--prefix-len", "40", "--output-len", "12", "--rate", "2"])
    assert result.exit_code == 0, result.output
    trace = Trace.load(out)
    assert len(trace) == 20 and {r.output_len for r in trace} == {12} and max(r.prompt_len for r in trace) <= 100
    result = CliRunner().invoke(app, [*base, "--tokenizer", str(tokenizer_dir), "--disable-shuffle"])
    assert result.exit_code == 2 and "--disable-shuffle: not used with --format sonnet" in result.output
    result = CliRunner().invoke(app, [*base])
    assert result.exit_code == 2 and "--tokenizer: a sonnet file holds text" in result.output
    result = CliRunner().invoke(app, ["workload", "import", str(poem), "--format", "custom", "-o", str(out),
                                      "--input-len", "5"])
    assert result.exit_code == 2 and "--input-len: not used with --format custom" in result.output
