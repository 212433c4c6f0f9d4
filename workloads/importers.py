"""Traces from real data the user has locally: a ShareGPT JSON dump, a production CSV."""

from __future__ import annotations

import json
import math
import random
import re
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from engine.unicode_text import has_lone_surrogate

from .arrivals import TIME_DECIMALS, arrival_times
from .errors import TraceError, where
from .lengths import VLLM_FILTER, LengthFilter
from .schema import TraceRequest
from .text import read_text, text_lines
from .tokens import stream
from .trace import Trace
from .trace_files import MAX_ARRIVAL_TIME, MAX_TOKENS, csv_header, csv_rows

# --- ShareGPT ------------------------------------------------------------------------


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def check_length_arg(name: str, tokens: int) -> None:
    """A length asked of an import: 1 token to the trace's cap (checked before any work, not in the file)."""
    if not 1 <= tokens <= MAX_TOKENS:
        raise TraceError(f"{name}: must be 1 to {MAX_TOKENS:,} tokens, got {tokens:,}")


class SourceTexts:
    """A tokenizer for one source file's texts: one no tokenizer can take (a lone UTF-16 surrogate, which a
    JSON escape can hold) is refused in a line naming the file, and a text longer than the tokenizer's
    model_max_length is tokenized without transformers' warning (the trace's caps judge lengths)."""

    def __init__(self, tokenizer, source: Path) -> None:
        self.tokenizer, self.source = tokenizer, source

    def __call__(self, text: str, **kwargs):
        if has_lone_surrogate(text):
            raise TraceError(f"{self.source}: a text holds a lone UTF-16 surrogate, which is not Unicode: "
                             f"{text[:40]!r}")
        return self.tokenizer(text, verbose=False, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def load_tokenizer(tokenizer_path: str | Path, source: Path | None = None):
    """The tokenizer in a folder; with `source`, the file whose texts it will read (SourceTexts)."""
    # local_files_only: a tokenizer is a folder the user has, never a download
    from transformers import AutoTokenizer

    folder = Path(tokenizer_path)
    if not folder.is_dir():
        raise TraceError(f"{folder}: tokenizer folder not found")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise TraceError(f"{folder}: no tokenizer in it (none of {', '.join(TOKENIZER_FILES)}): give the model's "
                         f"folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TraceError(f"{folder}: cannot load a tokenizer: {first}") from None
    return tokenizer if source is None else SourceTexts(tokenizer, source)


def _chat(tokenizer, text: str) -> list[int]:
    """The tokens of `text` sent as one user message in the tokenizer's chat template, as vLLM counts them."""
    formatted = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=False)
    return list(tokenizer(formatted).input_ids)


def json_conversations(path: Path, dump: str, *, also: str = "") -> list | dict:
    """The JSON list of conversations in `path` (a `dump`, as the errors name it), or a TraceError that says
    what is wrong with the file; `also` names an object the caller takes instead of a list ("" for none)."""
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    text = read_text(path)
    if not text.strip():
        raise TraceError(f"{path}: no requests in it (the file is empty)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        hint = f" (JSON Lines? a {dump} is one JSON list)" if err.msg == "Extra data" else ""
        raise TraceError(f"{where(path, err.lineno)}: invalid JSON: {err.msg} (column {err.colno}){hint}") from None
    except RecursionError:
        raise TraceError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError as err:   # an integer of more than 4300 digits
        raise TraceError(f"{path}: invalid JSON: {str(err).splitlines()[0]}") from None
    if isinstance(data, dict) and also:
        return data
    if not isinstance(data, list):
        kind = "an object" if isinstance(data, dict) else type(data).__name__
        raise TraceError(f"{path}: expected a JSON list of conversations{f' or {also}' if also else ''}, got {kind}")
    return data


def _sharegpt_pairs(path: Path) -> list[tuple[str, str]]:
    """(first human turn, first answer) of every conversation with at least two turns."""
    data = json_conversations(path, "ShareGPT dump")
    pairs = []
    for i, entry in enumerate(data):
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise TraceError(f"{path}: entry {i}: conversations: missing or not a list")
        if len(conv) < 2:
            continue  # vLLM drops conversations without an answer
        texts = []
        for turn in conv[:2]:
            value = turn.get("value") if isinstance(turn, dict) else None
            if not isinstance(value, str):
                raise TraceError(f"{path}: entry {i}: conversations.value: missing or not a string")
            texts.append(value)
        pairs.append((texts[0], texts[1]))
    if not pairs:
        raise TraceError(f"{path}: no requests in it (no conversation has a prompt and an answer)")
    return pairs


def _tokenized_pairs(pairs: list[tuple[str, str]], tokenizer, num_requests: int, fixed_output_len: int | None,
                     lfilter: LengthFilter) -> list[tuple[list[int], int, list[int] | None]]:
    """(prompt token ids, output length, the answer's ids) of the first ``num_requests`` pairs, in
    order, whose lengths pass ``lfilter`` (vLLM tokenizes lazily, stopping there). The answer's ids
    are kept when the output length is the answer's (no ``fixed_output_len``)."""
    kept: list[tuple[list[int], int, list[int] | None]] = []
    for prompt, answer in pairs:
        if len(kept) == num_requests:
            break
        prompt_ids = list(tokenizer(prompt).input_ids)
        answer_ids = None if fixed_output_len else list(tokenizer(answer).input_ids)   # as vLLM counts it
        output_len = fixed_output_len or len(answer_ids)
        p, o = len(prompt_ids), output_len
        too_short = p < lfilter.min_len or (fixed_output_len is None and o < lfilter.min_len)
        if too_short or p > lfilter.max_prompt_len or p + o > lfilter.max_total_len:
            continue
        kept.append((prompt_ids, output_len, answer_ids))
    return kept


def _oversampled(kept: list, num_requests: int, seed: int, oversample: bool) -> list:
    """vLLM bench's ``maybe_oversample_requests`` (vllm/benchmarks/datasets/abstractions.py): a dataset with
    fewer usable requests than asked for is topped up with copies of random ones, drawn by ``random.seed(seed);
    random.choice`` (the same draws here); ``oversample=False`` is its ``--no-oversample``."""
    if not oversample or len(kept) >= num_requests or not kept:
        return kept
    draw = random.Random(seed)
    return kept + [draw.choice(kept) for _ in range(num_requests - len(kept))]


def import_sharegpt(
    path: str | Path,
    tokenizer_path: str | Path,
    num_requests: int,
    seed: int = 0,
    *,
    fixed_output_len: int | None = None,
    keep_token_ids: bool = True,
    arrival: str = "poisson",
    rate: float = math.inf,
    cv: float = 1.0,
    lfilter: LengthFilter = VLLM_FILTER,
    oversample: bool = True,
    shuffle: bool = True,
) -> Trace:
    """Sample requests from a local ShareGPT JSON file by vLLM's benchmark rules.

    As vLLM's ``ShareGPTDataset``: keep conversations with at least two
    turns, take the first turn as the prompt and the second as the reference
    answer, shuffle with Python's ``random`` seeded by ``seed`` (the same
    permutation as vLLM's ``random.seed(seed); random.shuffle``), tokenize with
    the given tokenizer folder, and walk the shuffled list keeping pairs that
    pass the filter (prompt and output >= 4 tokens, prompt <= 1024, total <=
    2048) until ``num_requests`` are kept.  The output length is the answer's
    token count unless ``fixed_output_len`` is given (then only the prompt
    side of the minimum applies, as in vLLM).  Arrivals are generated with the
    given process (default: all at t = 0).  If the file has fewer usable
    pairs, copies of random ones fill the count, as vLLM bench oversamples
    (``oversample=False``: the trace is shorter); ``params["available"]`` says
    how many the file had.  ``shuffle=False`` keeps the file's order (vLLM
    bench's ``--disable-shuffle``).
    """
    path = Path(path)
    if num_requests < 1:
        raise TraceError(f"num_requests: must be >= 1, got {num_requests}")
    if fixed_output_len is not None:
        check_length_arg("fixed_output_len", fixed_output_len)
    pairs = _sharegpt_pairs(path)
    tokenizer = load_tokenizer(tokenizer_path, source=path)
    if shuffle:                   # (vLLM bench's --disable-shuffle: the file's order)
        random.Random(seed).shuffle(pairs)
    available = _tokenized_pairs(pairs, tokenizer, num_requests, fixed_output_len, lfilter)
    kept = _oversampled(available, num_requests, seed, oversample)
    times = arrival_times(stream(seed, "arrivals"), arrival=arrival, rate=rate, cv=cv, num_requests=len(kept))
    requests = [
        TraceRequest(
            request_id=f"sharegpt-{i}",
            arrival_time=float(t),
            prompt_len=len(ids),
            output_len=out,
            prompt_token_ids=ids if keep_token_ids else None,
            output_token_ids=answer if keep_token_ids else None,
        )
        for i, ((ids, out, answer), t) in enumerate(zip(kept, times))
    ]
    params = {
        "source": str(path), "tokenizer": str(tokenizer_path), "num_requests": num_requests,
        "available": len(available), "seed": seed, "fixed_output_len": fixed_output_len,
        "arrival": arrival, "rate": rate, "cv": cv,
    }
    return Trace(requests, name="sharegpt-import", params=params)


# --- vLLM bench's custom dataset (JSONL of prompts) --------------------------------------

DEFAULT_CUSTOM_OUTPUT_LEN = 256        # vLLM bench's --custom-output-len


def _custom_prompts(path: Path) -> list[str]:
    """The "prompt" of every line of a JSON Lines file, in order."""
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    prompts = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceError(f"{where(path, number)}: invalid JSON: {err.msg} (column {err.colno})") from None
        except (RecursionError, ValueError):
            raise TraceError(f"{where(path, number)}: invalid JSON") from None
        prompt = entry.get("prompt") if isinstance(entry, dict) else None
        if not isinstance(prompt, str):
            raise TraceError(f"{where(path, number)}: field 'prompt' is missing or not a string (vLLM bench's "
                             f"custom dataset: one {{\"prompt\": ...}} object a line)")
        prompts.append(prompt)
    if not prompts:
        raise TraceError(f"{path}: no requests in it (no line holds a prompt)")
    return prompts


def import_custom(
    path: str | Path,
    tokenizer_path: str | Path,
    num_requests: int,
    seed: int = 0,
    *,
    output_len: int = DEFAULT_CUSTOM_OUTPUT_LEN,
    skip_chat_template: bool = False,
    keep_token_ids: bool = True,
    arrival: str = "poisson",
    rate: float = math.inf,
    cv: float = 1.0,
    oversample: bool = True,
    shuffle: bool = True,
) -> Trace:
    """Requests from a JSON Lines file of ``{"prompt": ...}`` by vLLM bench's custom dataset's rules
    (vllm/benchmarks/datasets/custom.py, ``CustomDataset``): the lines shuffled by ``random.seed(seed);
    random.shuffle``, the first ``num_requests`` taken, each prompt put in the tokenizer's chat template as
    one user message with the generation prompt (unless ``skip_chat_template``, vLLM's --skip-chat-template)
    and tokenized as vLLM counts it, every output ``output_len`` tokens (--custom-output-len); too few lines
    are oversampled as vLLM bench does (``oversample=False``: its --no-oversample; ``shuffle=False``: its
    --disable-shuffle)."""
    path = Path(path)
    if num_requests < 1:
        raise TraceError(f"num_requests: must be >= 1, got {num_requests}")
    check_length_arg("output_len", output_len)
    prompts = _custom_prompts(path)
    tokenizer = load_tokenizer(tokenizer_path, source=path)
    if not skip_chat_template and not getattr(tokenizer, "chat_template", None):
        raise TraceError(f"{tokenizer_path}: the tokenizer has no chat template to put the prompts in; give "
                         f"--skip-chat-template (vLLM bench's flag) to send them as they are")
    if shuffle:
        random.Random(seed).shuffle(prompts)
    available = []
    for prompt in prompts[:num_requests]:
        ids = list(tokenizer(prompt).input_ids) if skip_chat_template else _chat(tokenizer, prompt)
        if not ids:
            raise TraceError(f"{path}: a prompt tokenizes to no tokens: {prompt[:40]!r}")
        available.append(ids)
    kept = _oversampled(available, num_requests, seed, oversample)
    times = arrival_times(stream(seed, "arrivals"), arrival=arrival, rate=rate, cv=cv, num_requests=len(kept))
    requests = [TraceRequest(request_id=f"custom-{i}", arrival_time=float(t), prompt_len=len(ids),
                             output_len=output_len, prompt_token_ids=ids if keep_token_ids else None)
                for i, (ids, t) in enumerate(zip(kept, times))]
    params = {"source": str(path), "tokenizer": str(tokenizer_path), "num_requests": num_requests,
              "available": len(available), "seed": seed, "output_len": output_len,
              "skip_chat_template": skip_chat_template, "arrival": arrival, "rate": rate, "cv": cv}
    return Trace(requests, name="custom-import", params=params)


# --- vLLM bench's sonnet dataset (poem lines behind a shared prefix) ---------------------

SONNET_DEFAULTS = {"input_len": 550, "output_len": 150, "prefix_len": 200}   # vLLM's SonnetDataset
SONNET_BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"
SONNET_DRAWS_PER_REQUEST = 1000        # vLLM redraws a prompt over input_len forever; here, up to this many times


def import_sonnet(
    path: str | Path,
    tokenizer_path: str | Path,
    num_requests: int,
    seed: int = 0,
    *,
    input_len: int = SONNET_DEFAULTS["input_len"],
    output_len: int = SONNET_DEFAULTS["output_len"],
    prefix_len: int = SONNET_DEFAULTS["prefix_len"],
    arrival: str = "poisson",
    rate: float = math.inf,
    cv: float = 1.0,
) -> Trace:
    """Requests from a text file of poem lines by vLLM bench's sonnet dataset's rules (vllm/benchmarks/datasets,
    ``SonnetDataset``): every prompt is a base instruction, the file's first lines (as many as fit
    ``prefix_len`` tokens at the lines' mean length: shared by every request, so the prefix cache serves them)
    and lines drawn at random (``random.seed(seed)``, then ``random.choices``: the same draws) up to about
    ``input_len`` tokens, in the tokenizer's chat template; a prompt over ``input_len`` tokens is drawn again,
    as vLLM does. Every output is ``output_len`` tokens."""
    path = Path(path)
    if num_requests < 1:
        raise TraceError(f"num_requests: must be >= 1, got {num_requests}")
    for name, value in (("input_len", input_len), ("output_len", output_len)):
        check_length_arg(name, value)
    if prefix_len < 0:
        raise TraceError(f"prefix_len: must be >= 0, got {prefix_len}")
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    lines = list(text_lines(path))       # as vLLM's readlines(): split at newlines only, each kept
    if not any(line.strip() for line in lines):
        raise TraceError(f"{path}: no lines in it")
    tokenizer = load_tokenizer(tokenizer_path, source=path)
    if not getattr(tokenizer, "chat_template", None):
        raise TraceError(f"{tokenizer_path}: the tokenizer has no chat template; vLLM bench's sonnet dataset puts "
                         f"every prompt in one")
    mean_line = sum(len(tokenizer(line).input_ids) for line in lines) / len(lines)
    base = len(_chat(tokenizer, SONNET_BASE_PROMPT))
    if input_len <= base:
        raise TraceError(f"input_len: {input_len} tokens leave no room after the base prompt's {base}")
    num_lines = round((input_len - base) / mean_line)
    num_prefix = max(round((prefix_len - base) / mean_line), 0)
    prefix = "".join(lines[:num_prefix])
    draw = random.Random(seed)
    prompts: list[list[int]] = []
    draws, most = 0, SONNET_DRAWS_PER_REQUEST * num_requests
    while len(prompts) < num_requests:
        if draws == most:
            raise TraceError(f"{path}: {len(prompts)} of {num_requests} prompts fit in input_len {input_len} after "
                             f"{most:,} draws (the file's first lines, the shared prefix, may be long): raise "
                             f"input_len or lower prefix_len")
        draws += 1
        ids = _chat(tokenizer, SONNET_BASE_PROMPT + prefix + "".join(draw.choices(lines, k=num_lines - num_prefix)))
        if len(ids) <= input_len:
            prompts.append(ids)
    times = arrival_times(stream(seed, "arrivals"), arrival=arrival, rate=rate, cv=cv, num_requests=num_requests)
    requests = [TraceRequest(request_id=f"sonnet-{i}", arrival_time=float(t), prompt_len=len(ids),
                             output_len=output_len, prompt_token_ids=ids)
                for i, (ids, t) in enumerate(zip(prompts, times))]
    params = {"source": str(path), "tokenizer": str(tokenizer_path), "num_requests": num_requests, "seed": seed,
              "input_len": input_len, "output_len": output_len, "prefix_len": prefix_len, "prefix_lines": num_prefix,
              "lines_per_prompt": num_lines, "arrival": arrival, "rate": rate, "cv": cv}
    return Trace(requests, name="sonnet-import", params=params)


# --- production CSV (e.g. the Azure LLM inference traces) --------------------------------

# "2023-11-16 18:15:46.6805900": Azure writes 7 fractional digits, more than
# datetime parses, so the fraction is split off and added exactly.
_DATETIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?$")


MAX_TIMESTAMP_DIGITS = 18     # a timestamp below 10^18 s (epoch nanoseconds would be); a larger one is no time


def parse_timestamp(cell: str) -> Decimal:
    """Seconds from a number or a date-time (naive times are read as UTC).

    Decimal, not float: epoch seconds (~1.7e9) leave a float only ~0.2 us of
    resolution, and differences of nearby stamps should be exact.
    """
    cell = cell.strip()
    try:
        value = Decimal(cell)
    except InvalidOperation:
        value = None
    if value is not None:
        if not value.is_finite():
            raise ValueError(f"not a finite time: {cell!r}")
        if value.adjusted() >= MAX_TIMESTAMP_DIGITS:   # (no arithmetic: one that large overflows it)
            raise ValueError(f"not a time in seconds: {cell[:40]!r} is 10^{MAX_TIMESTAMP_DIGITS} or more")
        return value
    m = _DATETIME.match(cell)
    if not m:
        raise ValueError(f"not seconds or a date-time: {cell!r}")
    base, fraction, zone = m.groups()
    try:
        stamp = datetime.fromisoformat(base + ("+00:00" if zone in (None, "Z") else zone))
    except ValueError:
        raise ValueError(f"not a valid date-time: {cell!r}") from None
    whole = int(stamp.astimezone(timezone.utc).timestamp())  # exact: no fraction left in stamp
    return Decimal(whole) + (Decimal(fraction) if fraction else Decimal(0))


def _length(cell: str) -> int:
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"not a number of tokens: {cell!r}") from None
    if not value.is_integer():
        raise ValueError(f"not a whole number of tokens: {cell!r}")
    if value > MAX_TOKENS:
        raise ValueError(f"{cell} is over the cap of {MAX_TOKENS:,} tokens")
    return int(value)


def _cell(cell: str, col: str, parse, path: Path, line: int):
    """One cell parsed, or a TraceError naming its line and column."""
    cell = cell.strip()
    if not cell:
        raise TraceError(f"{where(path, line, col)}: empty cell")
    try:
        return parse(cell)
    except ValueError as err:
        raise TraceError(f"{where(path, line, col)}: {err}") from None


def _csv_requests(path: Path, lines, header: list[str], columns: tuple[str, str, str], num_requests: int | None,
                  drop_zero: bool, only: tuple[str, str] | None = None,
                  duration: float | None = None) -> tuple[list[tuple[Decimal, int, int]], int]:
    """(timestamp, prompt tokens, output tokens) of the first ``num_requests`` rows
    (those whose ``only[0]`` cell is ``only[1]``, if given; read no further than
    ``duration`` seconds past the first), each checked as it is read (cell count,
    timestamps in order and within the cap, lengths), and how many rows a zero length
    dropped."""
    timestamp_col = columns[0]
    cols = [(col, header.index(col), parse) for col, parse in zip(columns, (parse_timestamp, _length, _length))]
    only_at = header.index(only[0]) if only else None
    rows: list[tuple[Decimal, int, int]] = []
    dropped = 0
    prev: Decimal | None = None
    for line, cells in lines:
        if num_requests is not None and len(rows) >= num_requests:
            break
        if len(cells) != len(header):
            raise TraceError(f"{where(path, line)}: row has {len(cells)} cells, header has {len(header)}")
        if only and cells[only_at].strip() != only[1]:
            continue
        t, p, o = (_cell(cells[i], col, parse, path, line) for col, i, parse in cols)
        if prev is not None and t < prev:
            raise TraceError(f"{where(path, line, timestamp_col)}: {cells[cols[0][1]].strip()} is before the previous row's timestamp (timestamps must not decrease)")
        if duration is not None and rows and t - rows[0][0] >= Decimal(repr(duration)):
            break                 # a long log's later rows are neither needed nor checked
        if rows and t - rows[0][0] > MAX_ARRIVAL_TIME:
            raise TraceError(f"{where(path, line, timestamp_col)}: {float(t - rows[0][0]):g} s after the first row, "
                             f"over the cap of {MAX_ARRIVAL_TIME:,.0f} s")
        prev = t
        for col, n in zip(columns[1:], (p, o)):
            if n < 0 or (n == 0 and not drop_zero):
                hint = "" if n < 0 else " (planner workload import --format azure --drop-zero skips such rows)"
                raise TraceError(f"{where(path, line, col)}: length must be >= 1, got {n}{hint}")
        if p == 0 or o == 0:
            dropped += 1
            continue
        rows.append((t, p, o))
    return rows, dropped


def import_csv_trace(
    path: str | Path,
    timestamp_col: str = "TIMESTAMP",
    prompt_col: str = "ContextTokens",
    output_col: str = "GeneratedTokens",
    *,
    num_requests: int | None = None,
    duration: float | None = None,
    drop_zero: bool = False,
    name: str | None = None,
    only: tuple[str, str] | None = None,
) -> Trace:
    """A trace from a CSV with timestamp, prompt-token and output-token columns.

    Defaults fit the Azure LLM inference traces (TIMESTAMP, ContextTokens,
    GeneratedTokens).  Timestamps are seconds or date-times and must not
    decrease; arrival times are relative to the first row.  A negative length
    is an error; a zero length is an error too unless ``drop_zero`` (some
    production rows record requests that produced nothing), in which case the
    row is skipped and counted in ``params["dropped_rows"]``.  ``only=(column,
    value)`` keeps the rows whose cell in that column is the value.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    lines = csv_rows(path)
    columns = (timestamp_col, prompt_col, output_col)
    # other columns are the production log's own (and may be unnamed, e.g. a pandas index)
    header, _ = csv_header(path, lines, columns + ((only[0],) if only else ()), all_named=False)
    rows, dropped = _csv_requests(path, lines, header, columns, num_requests, drop_zero, only, duration)
    if not rows:
        kept = f" with {only[0]} {only[1]}" if only else ""
        raise TraceError(f"{path}: no requests{kept} in it"
                         + (f" ({dropped} rows with a zero length skipped)" if dropped else ""))
    start = rows[0][0]
    stem = name or path.stem
    requests = [
        TraceRequest(request_id=f"{stem}-{i}", arrival_time=round(float(t - start), TIME_DECIMALS), prompt_len=p, output_len=o)
        for i, (t, p, o) in enumerate(rows)
    ]
    params = {
        "source": str(path), "timestamp_col": timestamp_col, "prompt_col": prompt_col,
        "output_col": output_col, "dropped_rows": dropped, **({"only": list(only)} if only else {}),
    }
    trace = Trace(requests, name=stem, params=params)
    return trace.head(duration=duration) if duration is not None else trace


# --- BurstGPT (Wang et al., 2024: a real log of ChatGPT and GPT-4 requests) --------------

BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
BURSTGPT_ONLY = ("Model", "GPT-4")      # vLLM bench's BurstGPTDataset uses these rows only
BENCH_NUM_PROMPTS = 1000                # vllm bench serve's --num-prompts default


def _burstgpt_population(path: Path) -> list[tuple[int, int]]:
    """(request tokens, response tokens) of the rows vLLM bench's BurstGPT dataset samples from, in file order:
    the GPT-4 rows with a response (a zero is a failed request)."""
    lines = csv_rows(path)
    header, _ = csv_header(path, lines, BURSTGPT_COLUMNS + BURSTGPT_ONLY[:1], all_named=False)
    model_at = header.index(BURSTGPT_ONLY[0])
    lengths = [(col, header.index(col)) for col in BURSTGPT_COLUMNS[1:]]
    population = []
    for line, cells in lines:
        if len(cells) != len(header):
            raise TraceError(f"{where(path, line)}: row has {len(cells)} cells, header has {len(header)}")
        if cells[model_at].strip() != BURSTGPT_ONLY[1]:
            continue
        prompt, response = (_cell(cells[i], col, _length, path, line) for col, i in lengths)
        for col, n in zip(BURSTGPT_COLUMNS[1:], (prompt, response)):
            if n < 0:
                raise TraceError(f"{where(path, line, col)}: length must be >= 0, got {n}")
        if response > 0:
            population.append((prompt, response))
    if not population:
        raise TraceError(f"{path}: no {BURSTGPT_ONLY[0]} {BURSTGPT_ONLY[1]} rows with a response in it (vLLM "
                         f"bench's BurstGPT dataset samples only those)")
    return population


def import_burstgpt(
    path: str | Path,
    num_requests: int | None = None,
    seed: int = 0,
    *,
    keep_times: bool = False,
    duration: float | None = None,
    arrival: str = "poisson",
    rate: float = math.inf,
    cv: float = 1.0,
) -> Trace:
    """Requests from a BurstGPT CSV (Timestamp, Model, Request tokens, Response tokens, ...).

    By vLLM bench's rules (vllm/benchmarks/datasets, ``BurstGPTDataset``): the GPT-4 rows with a response, of
    which ``num_requests`` (default 1,000) are drawn as pandas' ``DataFrame.sample(n, random_state=seed)`` draws
    them (numpy's ``RandomState(seed)``: a permutation's first n, or n with replacement when the file has
    fewer), each request its row's token counts, arrivals generated by the given process.  vLLM sends a drawn row with no
    request tokens as an empty prompt, which its server rejects: such requests are left out (their arrival
    slot with them) and counted in ``params["empty_prompts"]``.

    ``keep_times``: the log's own arrivals instead, BurstGPT's burstiness: the same rows in file order at their
    timestamps (relative to the first), the first ``num_requests`` of them (all by default) or those in the
    first ``duration`` seconds; rows with a zero count are skipped and counted in ``params["dropped_rows"]``.
    """
    path = Path(path)
    if num_requests is not None and num_requests < 1:
        raise TraceError(f"num_requests: must be >= 1, got {num_requests}")
    if keep_times:
        return import_csv_trace(path, *BURSTGPT_COLUMNS, num_requests=num_requests, duration=duration,
                                drop_zero=True, name="burstgpt", only=BURSTGPT_ONLY)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    population = _burstgpt_population(path)
    n = num_requests or BENCH_NUM_PROMPTS
    draw = np.random.RandomState(seed)
    picks = draw.permutation(len(population))[:n] if n <= len(population) else draw.randint(0, len(population), n)
    times = arrival_times(stream(seed, "arrivals"), arrival=arrival, rate=rate, cv=cv, num_requests=n)
    requests = [TraceRequest(request_id=f"burstgpt-{i}", arrival_time=float(t), prompt_len=population[k][0],
                             output_len=population[k][1])
                for i, (k, t) in enumerate(zip(picks.tolist(), times)) if population[k][0] > 0]
    if not requests:
        raise TraceError(f"{path}: every drawn row has no request tokens (vLLM's server rejects an empty prompt)")
    params = {"source": str(path), "num_requests": n, "available": len(population), "seed": seed,
              "empty_prompts": n - len(requests), "arrival": arrival, "rate": rate, "cv": cv}
    trace = Trace(requests, name="burstgpt-import", params=params)
    return trace.head(duration=duration) if duration is not None else trace
