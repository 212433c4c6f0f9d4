"""Bad trace files, as careless users hand them over: each is refused with one line naming the
file, the line (or row, or JSON entry) and the field, as a TraceError the CLI prints with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from planner.cli import app
from workloads import Trace, TraceError, import_csv_trace, import_sharegpt
from workloads.trace_files import MAX_ARRIVAL_TIME, MAX_SAMPLES, MAX_TOKENS

HEADER = "arrival_time,prompt_len,output_len\n"


def line(**fields) -> str:
    """One JSONL request line: a valid request with ``fields`` replaced."""
    return json.dumps({"arrival_time": 0.0, "prompt_len": 4, "output_len": 2} | fields, ensure_ascii=False) + "\n"


def write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def refused(path, load=Trace.load) -> str:
    """The message a bad file is refused with; it must be one line that starts with the file."""
    with pytest.raises(TraceError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(str(path)), message
    return message


def check(tmp_path, name, content, pattern, load=Trace.load):
    message = refused(write(tmp_path, name, content), load)
    assert re.search(pattern, message), message


# --- 1. files with no requests -------------------------------------------------------------


@pytest.mark.parametrize("name,content", [
    ("empty.jsonl", ""),
    ("blank.jsonl", "  \n\n\t\n"),
    ("only_metadata.jsonl", '{"trace": {"name": "x", "params": {}}}\n'),
    ("empty.csv", ""),
    ("blank.csv", "\n  \n"),
    ("header_only.csv", HEADER),
    ("header_and_blank_lines.csv", HEADER + "\n,,\n"),
])
def test_a_file_without_requests_is_refused(tmp_path, name, content):
    check(tmp_path, name, content, r": no requests in it$")


# --- 2. not UTF-8 text ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,content,pattern", [
    ("png.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"png\.jsonl:1: not UTF-8 text \(byte 0x89 at byte 1"),
    ("zeros.jsonl", b"\x00" * 64, r"zeros\.jsonl:1: not UTF-8 text \(a NUL byte"),
    ("nul_in_line_2.csv", HEADER.encode() + b"0,4,2\x00\n", r"nul_in_line_2\.csv:2: not UTF-8 text \(a NUL byte"),
    ("latin1.jsonl", line().encode() + line(request_id="café").encode("latin-1"),
     r"latin1\.jsonl:2: not UTF-8 text \(byte 0xe9"),
    # a spreadsheet's Latin-1 export: the bad byte is in a cell of row 3
    ("latin1.csv", ("request_id," + HEADER + "a,0,4,2\n").encode() + "café,1,4,2\n".encode("latin-1"),
     r"latin1\.csv:3: not UTF-8 text \(byte 0xe9 at byte 4 of the line"),
    ("utf16.csv", (HEADER + "0,4,2\n").encode("utf-16"), r"utf16\.csv:1: not UTF-8 text \(UTF-16"),
])
def test_binary_and_other_encodings_are_refused_by_line(tmp_path, name, content, pattern):
    check(tmp_path, name, content, pattern)


def test_the_bad_line_is_found_past_the_decoders_first_block(tmp_path):
    # text files are decoded in blocks of several KB, so the codec's position is not the line's
    content = (line() * 2000).encode() + line(request_id="naïve").encode("latin-1")
    check(tmp_path, "late.jsonl", content, r"late\.jsonl:2001: not UTF-8 text \(byte 0xef")


# --- 3. a byte-order mark is accepted ----------------------------------------------------------------


def test_a_utf8_bom_is_skipped(tmp_path):
    bom = b"\xef\xbb\xbf"
    for name, text in (("t.csv", HEADER + "0,4,2\n1.5,8,3\n"), ("t.jsonl", line() + line(arrival_time=1.5, prompt_len=8, output_len=3))):
        plain = Trace.load(write(tmp_path, name, text))
        with_bom = Trace.load(write(tmp_path, "bom_" + name, bom + text.encode()))
        assert [(r.arrival_time, r.prompt_len, r.output_len) for r in with_bom] == [(0.0, 4, 2), (1.5, 8, 3)]
        assert [r.prompt_len for r in with_bom] == [r.prompt_len for r in plain]
    azure = Trace.load(write(tmp_path, "azure.csv", bom + b"TIMESTAMP,ContextTokens,GeneratedTokens\n5,10,20\n7,11,21\n"))
    assert [(r.arrival_time, r.prompt_len) for r in azure] == [(0.0, 10), (2.0, 11)]


# --- 4. booleans and fractions are not integers ---------------------------------------------------------


@pytest.mark.parametrize("field", ["prompt_len", "output_len", "n", "beam_width", "prefix_len", "turn"])
def test_a_boolean_or_fraction_in_an_integer_field_is_refused(tmp_path, field):
    check(tmp_path, "b.jsonl", line() + line(**{field: True}), rf"b\.jsonl:2: {field}: must be an integer, got true$")
    check(tmp_path, "f.jsonl", line(**{field: False}), rf"f\.jsonl:1: {field}: must be an integer, got false$")
    check(tmp_path, "h.jsonl", line(**{field: 2.5}), rf"h\.jsonl:1: {field}: must be an integer, got 2\.5$")
    cells = {"arrival_time": "0", "prompt_len": "4", "output_len": "2"} | {field: "2.5"}
    check(tmp_path, "h.csv", ",".join(cells) + "\n" + ",".join(cells.values()) + "\n",
          rf"h\.csv:2: {field}: must be an integer, got \"2\.5\"$")


def test_other_booleans_are_refused_and_the_word_true_elsewhere_is_not(tmp_path):
    check(tmp_path, "t.jsonl", line(arrival_time=True), r"t\.jsonl:1: arrival_time: must be a number, got true$")
    check(tmp_path, "ids.jsonl", line(prompt_len=2, prompt_token_ids=[5, True]),
          r"ids\.jsonl:1: prompt_token_ids\.1: must be an integer, got true$")
    check(tmp_path, "ids2.jsonl", line(prompt_len=2, prompt_token_ids=[5, 6.0]),
          r"ids2\.jsonl:1: prompt_token_ids\.1: must be an integer, got 6\.0$")
    # the fast path looks for the text "true": an id that contains it must still load
    trace = Trace.load(write(tmp_path, "ok.jsonl", line(request_id="true-false", prefix_id="true")))
    assert trace[0].request_id == "true-false" and trace[0].prompt_len == 4


def test_integral_numbers_are_still_accepted(tmp_path):
    trace = Trace.load(write(tmp_path, "ok.jsonl", line(prompt_len=12.0, output_len=1e3, n=2)))
    assert (trace[0].prompt_len, trace[0].output_len, trace[0].n) == (12, 1000, 2)


# --- 5. non-finite, negative and absurd values --------------------------------------------------------


@pytest.mark.parametrize("value,pattern", [
    (float("nan"), r"arrival_time: must be a finite number, got NaN$"),
    (float("inf"), r"arrival_time: must be a finite number, got Infinity$"),
    (-1.0, r"arrival_time: Input should be greater than or equal to 0"),
    (1e300, r"arrival_time: 1e\+300 is over the cap of 10,000,000 s$"),
    (MAX_ARRIVAL_TIME + 1, r"arrival_time: 1e\+07 is over the cap"),
])
def test_bad_arrival_times_are_refused(tmp_path, value, pattern):
    check(tmp_path, "t.jsonl", line(arrival_time=value), r"t\.jsonl:1: " + pattern)


@pytest.mark.parametrize("cell,pattern", [
    ("nan", r"must be a finite number, got \"nan\""),
    ("inf", r"must be a finite number, got \"inf\""),
    ("1e300", r"1e\+300 is over the cap"),
    ("yesterday", r"must be a number, got \"yesterday\""),
])
def test_bad_arrival_times_in_a_csv(tmp_path, cell, pattern):
    check(tmp_path, "t.csv", HEADER + f"0,4,2\n{cell},4,2\n", r"t\.csv:3: arrival_time: " + pattern)


def test_the_caps_are_inclusive(tmp_path):
    at_caps = line(arrival_time=MAX_ARRIVAL_TIME, prompt_len=MAX_TOKENS, output_len=MAX_TOKENS,
                   n=MAX_SAMPLES, beam_width=MAX_SAMPLES)
    req = Trace.load(write(tmp_path, "caps.jsonl", at_caps))[0]
    assert (req.arrival_time, req.prompt_len, req.n) == (MAX_ARRIVAL_TIME, MAX_TOKENS, MAX_SAMPLES)


@pytest.mark.parametrize("field,value,pattern", [
    ("prompt_len", MAX_TOKENS + 1, r"10,000,001 is over the cap of 10,000,000 tokens$"),
    ("output_len", 10**12, r"1,000,000,000,000 is over the cap of 10,000,000 tokens$"),
    ("n", MAX_SAMPLES + 1, r"1,025 is over the cap of 1,024 sequences$"),
    ("beam_width", 10**9, r"1,000,000,000 is over the cap of 1,024 sequences$"),
])
def test_sizes_over_the_caps_are_refused(tmp_path, field, value, pattern):
    check(tmp_path, "big.jsonl", line() + line(**{field: value}), rf"big\.jsonl:2: {field}: " + pattern)
    cells = {"arrival_time": "0", "prompt_len": "4", "output_len": "2", field: str(value)}
    check(tmp_path, "big.csv", ",".join(cells) + "\n" + ",".join(cells.values()) + "\n", rf"big\.csv:2: {field}: " + pattern)


def test_a_think_time_over_the_cap_is_refused(tmp_path):
    # (a conversation of two turns 1e15 s apart filled the memory of a run's per-second counts)
    turns = line(conversation_id="c", turn=0) + line(conversation_id="c", turn=1, think_time=1e15)
    check(tmp_path, "think.jsonl", turns, r"think\.jsonl:2: think_time: 1e\+15 is over the cap of 10,000,000 s$")


# --- 6. what else careless users do -------------------------------------------------------------------


@pytest.mark.parametrize("name,content,pattern", [
    # JSONL
    ("dup.jsonl", line(request_id="a") + line(request_id="a", arrival_time=1.0), r"dup\.jsonl:2: request_id: duplicate id 'a'$"),
    ("dup_default.jsonl", line() + line(request_id="dup_default-0"), r"dup_default\.jsonl:2: request_id: duplicate id"),
    ("back.jsonl", line(arrival_time=5.0) + line(arrival_time=4.0), r"back\.jsonl:2: arrival_time: 4\.0 is before"),
    ("array.jsonl", "[" + line().strip() + "]\n", r"array\.jsonl:1: expected a JSON object, got an array"),
    ("pretty.jsonl", json.dumps([{"arrival_time": 0, "prompt_len": 4, "output_len": 2}], indent=2),
     r"pretty\.jsonl:1: invalid JSON: .*several lines"),
    ("commas.jsonl", line().strip() + ",\n", r"commas\.jsonl:1: invalid JSON: .*no comma after it"),
    ("number.jsonl", "42\n", r"number\.jsonl:1: expected a JSON object, got a number"),
    ("unknown.jsonl", line(prompt_tokens=4), r"unknown\.jsonl:1: prompt_tokens: Extra inputs are not permitted"),
    ("missing.jsonl", '{"arrival_time": 0, "prompt_len": 4}\n', r"missing\.jsonl:1: output_len: Field required"),
    ("null.jsonl", line(output_len=None), r"null\.jsonl:1: output_len: must be an integer, got null$"),
    ("quoted.jsonl", line(prompt_len="four"), r"quoted\.jsonl:1: prompt_len: must be an integer, got \"four\"$"),
    ("digits.jsonl", '{"arrival_time": 0, "prompt_len": ' + "9" * 5000 + ', "output_len": 2}\n',
     r"digits\.jsonl:1: invalid JSON: .*digits"),
    ("deep.jsonl", "[" * 100_000 + "\n", r"deep\.jsonl:1: invalid JSON: nested too deeply$"),
    ("late_metadata.jsonl", line() + '{"trace": {"name": "x"}}\n', r"late_metadata\.jsonl:2: trace: the metadata line must be the first line$"),
    ("two_metadata.jsonl", '{"trace": {}}\n{"trace": {}}\n' + line(), r"two_metadata\.jsonl:2: trace: the metadata line must be the first"),
    ("meta_extra.jsonl", '{"trace": {}, "arrival_time": 0}\n' + line(), r"meta_extra\.jsonl:1: arrival_time: the metadata line holds only 'trace'$"),
    ("meta_params.jsonl", '{"trace": {"params": 5}}\n' + line(), r"meta_params\.jsonl:1: trace\.params: must be an object, got 5$"),
    ("meta_name.jsonl", '{"trace": {"name": ["x"]}}\n' + line(), r"meta_name\.jsonl:1: trace\.name: must be a string"),
    ("csv_named.jsonl", HEADER + "0,4,2\n", r"csv_named\.jsonl:1: invalid JSON: .*a CSV file\? name it \.csv"),
    # CSV
    ("wide.csv", HEADER + "0,4,2\n1,4,2,9\n", r"wide\.csv:3: row has 4 cells, header has 3$"),
    ("narrow.csv", HEADER + "0,4\n", r"narrow\.csv:2: row has 2 cells, header has 3$"),
    ("no_output.csv", "arrival_time,prompt_len\n0,4\n", r"no_output\.csv:1: output_len: missing column \(header has arrival_time, prompt_len\)$"),
    ("no_header.csv", "0,4,2\n1,4,2\n", r"no_header\.csv:1: arrival_time: missing column .*the first line must be the header"),
    ("semicolons.csv", "arrival_time;prompt_len;output_len\n0;4;2\n", r"semicolons\.csv:1: arrival_time: missing column .*separated by commas"),
    ("twice.csv", "arrival_time,prompt_len,output_len,prompt_len\n0,4,2,5\n", r"twice\.csv:1: prompt_len: column appears twice \(columns 2 and 4\)$"),
    ("index.csv", "," + HEADER + "0,0,4,2\n", r"index\.csv:1: column 1 has no name"),
    ("unknown.csv", "arrival_time,prompt_len,output_len,model\n0,4,2,x\n", r"unknown\.csv:1: model: unknown column \(known: request_id, "),
    ("quote.csv", HEADER + "0,4,2\n1,4,2\n\"2,4,2\n3,4,2\n", r"quote\.csv:4: not valid CSV: .*never closed"),
    ("jsonl_named.csv", line() + line(), r"jsonl_named\.csv:1: .*a JSON Lines file\? name it \.jsonl"),
    ("compact_jsonl_named.csv", '{"arrival_time":0,"prompt_len":4,"output_len":2}\n',
     r"compact_jsonl_named\.csv:1: not valid CSV: .*a JSON Lines file\? name it \.jsonl\)$"),
    ("dup.csv", "request_id," + HEADER + "a,0,4,2\na,1,4,2\n", r"dup\.csv:3: request_id: duplicate id 'a'$"),
    ("back.csv", HEADER + "2,4,2\n1,4,2\n", r"back\.csv:3: arrival_time: 1\.0 is before"),
    ("ids.csv", "prompt_token_ids," + HEADER + "1 2 x,0,3,2\n", r"ids\.csv:2: prompt_token_ids: not space-separated integers$"),
])
def test_careless_files_are_refused_with_file_line_and_field(tmp_path, name, content, pattern):
    check(tmp_path, name, content, pattern)


# --- the importers --------------------------------------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("name,content,pattern", [
    ("header_only.csv", AZURE_HEADER, r"header_only\.csv: no requests in it$"),
    ("utf16.csv", (AZURE_HEADER + "1,2,3\n").encode("utf-16"), r"utf16\.csv:1: not UTF-8 text \(UTF-16"),
    ("latin1.csv", (AZURE_HEADER + "1,2,3\n").encode() + "2,4,4,é\n".encode("latin-1"), r"latin1\.csv:3: not UTF-8 text"),
    ("long.csv", AZURE_HEADER + "1,2,3\n2,1e30,3\n", r"long\.csv:3: ContextTokens: 1e30 is over the cap of 10,000,000 tokens$"),
    ("span.csv", AZURE_HEADER + "1,2,3\n1e9,2,3\n",
     r"span\.csv:3: TIMESTAMP: 1e\+09 s after the first row, over the cap"),
    ("huge.csv", AZURE_HEADER + "1,2,3\n1e9999999,2,3\n",
     r"huge\.csv:3: TIMESTAMP: not a time in seconds: '1e9999999' is 10\^18 or more"),
    ("nan.csv", AZURE_HEADER + "nan,2,3\n", r"nan\.csv:2: TIMESTAMP: not a finite time"),
    ("bool.csv", AZURE_HEADER + "1,true,3\n", r"bool\.csv:2: ContextTokens: not a number of tokens: 'true'$"),
    ("wide.csv", AZURE_HEADER + "1,2,3,4\n", r"wide\.csv:2: row has 4 cells, header has 3$"),
    ("twice.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP\n1,2,3,4\n", r"twice\.csv:1: TIMESTAMP: column appears twice"),
    ("quote.csv", AZURE_HEADER + '"1,2,3\n', r"quote\.csv:2: not valid CSV"),
])
def test_azure_importer_refuses_garbage(tmp_path, name, content, pattern):
    check(tmp_path, name, content, pattern, load=import_csv_trace)


def test_azure_importer_refuses_a_file_whose_rows_were_all_dropped(tmp_path):
    path = write(tmp_path, "zeros.csv", AZURE_HEADER + "1,0,3\n2,4,0\n")
    message = refused(path, lambda p: import_csv_trace(p, drop_zero=True))
    assert message.endswith("zeros.csv: no requests in it (2 rows with a zero length skipped)"), message


def test_azure_importer_ignores_other_columns_even_unnamed(tmp_path):
    # pandas writes its index as a first column with no name
    path = write(tmp_path, "pandas.csv", ",TIMESTAMP,ContextTokens,GeneratedTokens,model\n0,1,2,3,a\n1,2,5,6,b\n")
    assert [(r.arrival_time, r.prompt_len) for r in import_csv_trace(path)] == [(0.0, 2), (1.0, 5)]


def sharegpt(tmp_path):
    return lambda path: import_sharegpt(path, tmp_path / "no_tokenizer_needed", num_requests=1)


@pytest.mark.parametrize("name,content,pattern", [
    ("empty.json", "", r"empty\.json: no requests in it \(the file is empty\)$"),
    ("none.json", "[]", r"none\.json: no requests in it \(no conversation has a prompt and an answer\)$"),
    ("one_turn.json", json.dumps([{"conversations": [{"value": "hi"}]}]), r"no conversation has a prompt and an answer"),
    ("binary.json", b"\x89PNG\r\n\x1a\n", r"binary\.json:1: not UTF-8 text"),
    ("latin1.json", b'[\n{"conversations": [\n' + '{"value": "café"}]}]'.encode("latin-1"), r"latin1\.json:3: not UTF-8 text"),
    ("nul.json", b'[\n\n{"a": "\x00"}]', r"nul\.json:3: not UTF-8 text \(a NUL byte"),
    ("lines.json", '{"conversations": []}\n{"conversations": []}\n', r"lines\.json:2: invalid JSON: Extra data .*JSON Lines\?"),
    ("object.json", '{"conversations": []}', r"object\.json: expected a JSON list of conversations, got an object$"),
    ("deep.json", "[" * 100_000, r"deep\.json: invalid JSON: nested too deeply$"),
    ("entry.json", json.dumps([{"conversations": [{"value": "a"}, {"value": "b"}]}, {"conversations": "x"}]),
     r"entry\.json: entry 1: conversations: missing or not a list$"),
    ("value.json", json.dumps([{"conversations": [{"value": "a"}, {"value": 5}]}]),
     r"value\.json: entry 0: conversations\.value: missing or not a string$"),
])
def test_sharegpt_importer_refuses_garbage(tmp_path, name, content, pattern):
    check(tmp_path, name, content, pattern, load=sharegpt(tmp_path))


# --- the CLI: one line on stderr, exit code 2 -------------------------------------------------------------------

runner = CliRunner()


@pytest.mark.parametrize("name,content,expected", [
    ("empty.jsonl", "", "empty.jsonl: no requests in it"),
    ("flag.jsonl", line(prompt_len=True), "flag.jsonl:1: prompt_len: must be an integer, got true"),
    ("latin1.csv", HEADER.encode() + "0,4,2,é\n".encode("latin-1"), "latin1.csv:2: not UTF-8 text"),
    ("far.jsonl", line(arrival_time=1e300), "far.jsonl:1: arrival_time: 1e+300 is over the cap"),
    ("header_only.csv", AZURE_HEADER, "header_only.csv: no requests in it"),
])
def test_workload_show_prints_one_line_and_exits_2(tmp_path, name, content, expected):
    path = write(tmp_path, name, content)
    result = runner.invoke(app, ["workload", "show", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and expected in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_simulate_with_a_bad_trace_exits_2_with_one_line(tmp_path):
    # a real process: the exit code and stderr exactly as a user sees them
    path = write(tmp_path, "binary.jsonl", b"\x00\x01\x02\x03")
    cmd = [sys.executable, "-c", "import sys; from planner.cli import main; sys.exit(main())",
           "simulate", "--trace", str(path), "--model", "opt-125m", "--out", str(tmp_path / "run")]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: {path}:1: not UTF-8 text (a NUL byte: a binary file?)\n"


@pytest.mark.parametrize("ids, pattern", [
    ([1, 2, -3, 4], "prompt_token_ids: holds a negative token id"),
    ([1, 2, 3, 10**20], r"prompt_token_ids: holds a token id of 100,000,000,000,000,000,000, past any vocabulary"),
])
def test_token_ids_no_vocabulary_holds_are_refused_by_line(tmp_path, ids, pattern):
    # an id past 64 bits overflowed the simulator's arrays with a traceback before stop 68
    check(tmp_path, "ids.jsonl", line(prompt_token_ids=ids), r":1: " + pattern)
