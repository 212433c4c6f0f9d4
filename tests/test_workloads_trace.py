"""Trace schema, files (JSONL/CSV), statistics, scaling and stand-in token ids."""

import json
import math

import pytest

from workloads import Trace, TraceError, TraceRequest, make_trace


def req(i, t, p=10, o=5, **kw):
    return TraceRequest(request_id=f"r{i}", arrival_time=t, prompt_len=p, output_len=o, **kw)


def mixed_trace():
    """One request of every kind the schema can describe."""
    return Trace(
        [
            req(0, 0.0),
            req(1, 0.5, p=3, prompt_token_ids=[7, 8, 9]),
            req(2, 0.5, n=4),
            req(3, 1.25, beam_width=3),
            req(4, 2.0, p=100, prefix_id="shot", prefix_len=80),
            req(5, 3.0, conversation_id="c", turn=0),
            req(6, 9.0, p=20, conversation_id="c", turn=1, prefix_len=15),
        ],
        name="mixed",
        params={"rate": math.inf, "note": "x"},
    )


# --- schema -------------------------------------------------------------------------


def test_schema_rejects_inconsistent_requests():
    with pytest.raises(ValueError, match="prefix_len"):
        req(0, 0.0, p=5, prefix_len=6)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        req(0, 0.0, p=3, prompt_token_ids=[1, 2])
    with pytest.raises(ValueError, match="output_len"):
        req(0, 0.0, o=0)
    with pytest.raises(ValueError, match="arrival_time"):
        req(0, -1.0)


def test_trace_sorts_by_arrival_and_rejects_duplicate_ids():
    trace = Trace([req(0, 2.0), req(1, 1.0), req(2, 1.0)])
    assert [r.request_id for r in trace] == ["r1", "r2", "r0"]  # stable for ties
    with pytest.raises(TraceError, match="duplicate"):
        Trace([req(0, 0.0), req(0, 1.0)])


# --- files ----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_round_trip(tmp_path, suffix):
    trace = mixed_trace()
    path = trace.save(tmp_path / f"t{suffix}")
    back = Trace.load(path)
    assert back == trace
    assert back.requests[1].prompt_token_ids == [7, 8, 9]
    # saving what was loaded gives the same bytes
    again = back.save(tmp_path / f"again{suffix}")
    assert again.read_bytes() == path.read_bytes()
    if suffix == ".jsonl":  # CSV keeps requests only
        assert back.name == "mixed" and back.params == {"rate": "inf", "note": "x"}


def test_generated_round_trip_keeps_every_workload(tmp_path):
    for name in ("chatbot", "prefix", "parallel", "beam"):
        trace = make_trace(name, num_requests=50, rate=5.0, seed=3)
        assert Trace.load(trace.save(tmp_path / f"{name}.jsonl")) == trace
        assert Trace.load(trace.save(tmp_path / f"{name}.csv")) == trace


def test_same_arguments_same_bytes(tmp_path):
    a = make_trace("sharegpt", num_requests=500, rate=3.0, seed=7).save(tmp_path / "a.jsonl")
    b = make_trace("sharegpt", num_requests=500, rate=3.0, seed=7).save(tmp_path / "b.jsonl")
    c = make_trace("sharegpt", num_requests=500, rate=3.0, seed=8).save(tmp_path / "c.jsonl")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    d = make_trace("chatbot", num_requests=300, rate=3.0, arrival="gamma", cv=2.0, seed=1).save(tmp_path / "d.csv")
    e = make_trace("chatbot", num_requests=300, rate=3.0, arrival="gamma", cv=2.0, seed=1).save(tmp_path / "e.csv")
    assert d.read_bytes() == e.read_bytes()


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = '{"request_id":"a","arrival_time":0.0,"prompt_len":4,"output_len":2}\n'


def test_bad_json_line_names_file_and_line(tmp_path):
    path = write(tmp_path, "bad.jsonl", GOOD + '{"request_id": "b", "arrival_time": 1.0,\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: invalid JSON"):
        Trace.load(path)


def test_negative_length_names_line_and_field(tmp_path):
    line = '{"request_id":"b","arrival_time":1.0,"prompt_len":-3,"output_len":2}\n'
    with pytest.raises(TraceError, match=r"neg\.jsonl:2: prompt_len: .*greater than or equal to 1"):
        Trace.load(write(tmp_path, "neg.jsonl", GOOD + line))
    with pytest.raises(TraceError, match=r"neg\.csv:3: output_len"):
        Trace.load(write(tmp_path, "neg.csv", "request_id,arrival_time,prompt_len,output_len\na,0,4,2\nb,1,4,-1\n"))


def test_missing_field_and_column(tmp_path):
    with pytest.raises(TraceError, match=r"m\.jsonl:1: output_len: Field required"):
        Trace.load(write(tmp_path, "m.jsonl", '{"request_id":"a","arrival_time":0,"prompt_len":4}\n'))
    with pytest.raises(TraceError, match=r"m\.csv:1: output_len: missing column"):
        Trace.load(write(tmp_path, "m.csv", "request_id,arrival_time,prompt_len\na,0,4\n"))


def test_non_monotonic_timestamps(tmp_path):
    later = '{"request_id":"b","arrival_time":5.0,"prompt_len":4,"output_len":2}\n'
    earlier = '{"request_id":"c","arrival_time":4.0,"prompt_len":4,"output_len":2}\n'
    with pytest.raises(TraceError, match=r"nm\.jsonl:3: arrival_time: 4\.0 is before"):
        Trace.load(write(tmp_path, "nm.jsonl", GOOD + later + earlier))


def test_unknown_field_and_format(tmp_path):
    with pytest.raises(TraceError, match=r"u\.jsonl:1: colour"):
        Trace.load(write(tmp_path, "u.jsonl", '{"request_id":"a","arrival_time":0,"prompt_len":4,"output_len":2,"colour":1}\n'))
    with pytest.raises(TraceError, match="unknown trace format"):
        Trace.load(write(tmp_path, "t.txt", GOOD))
    with pytest.raises(TraceError, match="no such file"):
        Trace.load(tmp_path / "absent.jsonl")


# --- statistics and derived traces -----------------------------------------------------------


def test_stats():
    trace = Trace([req(i, float(i), p=i + 1, o=2 * (i + 1)) for i in range(101)])
    s = trace.stats()
    assert s["count"] == 101 and s["duration"] == 100.0 and s["arrival_rate"] == pytest.approx(1.0)
    assert s["prompt_len_mean"] == 51 and s["prompt_len_median"] == 51 and s["prompt_len_p99"] == pytest.approx(100)
    assert s["output_len_mean"] == 102 and s["output_len_max"] == 202
    assert Trace([req(0, 0.0), req(1, 0.0)]).stats()["arrival_rate"] == math.inf
    assert json.dumps(Trace([]).stats(), allow_nan=True)


def test_scaled_shrinks_and_keeps_structure():
    trace = make_trace("prefix", num_requests=200, shots=5, seed=1)
    small = trace.scaled(length_scale=0.1, max_output_len=3)
    assert len(small) == len(trace)
    assert all(r.prefix_len == 34 and r.prefix_len <= r.prompt_len for r in small)  # round(341 * 0.1)
    assert max(r.output_len for r in small) == 3
    assert small.params["scaled"]["length_scale"] == 0.1
    capped = trace.scaled(max_prompt_len=64)
    assert max(r.prompt_len for r in capped) == 64 and all(r.prefix_len <= r.prompt_len for r in capped)
    with pytest.raises(TraceError, match="length_scale"):
        trace.scaled(length_scale=0)


def test_scaled_chatbot_turns_still_extend_their_history():
    trace = make_trace("chatbot", num_requests=400, seed=2, mean_turns=6.0)
    small = trace.scaled(length_scale=0.05, max_prompt_len=256)
    by_id = {r.request_id: r for r in small}
    extended = 0
    for r in small:
        if r.turn > 0 and r.prefix_len > 0:
            prev = by_id[f"chatbot-{r.conversation_id[5:]}-{r.turn - 1}"]
            assert r.prefix_len == prev.prompt_len + prev.output_len < r.prompt_len <= 256
            extended += 1
    assert extended > 50


def test_head_and_retimed():
    trace = make_trace("alpaca", num_requests=1000, rate=10.0, seed=0)
    assert len(trace.head(num_requests=10)) == 10
    assert all(r.arrival_time < 5.0 for r in trace.head(duration=5.0))
    again = trace.retimed(arrival="constant", rate=4.0)
    assert [r.prompt_len for r in again] == [r.prompt_len for r in trace]
    assert again[1].arrival_time == pytest.approx(0.25)


# --- token ids ---------------------------------------------------------------------------


def test_prompt_ids_share_the_prefix_and_are_deterministic():
    trace = make_trace("prefix", num_requests=20, shots=1, num_prefixes=2, seed=0)
    ids = {r.request_id: trace.prompt_token_ids(r, vocab_size=1000, seed=5) for r in trace}
    for r in trace:
        assert len(ids[r.request_id]) == r.prompt_len
        assert all(4 <= t < 1000 for t in ids[r.request_id])  # special ids 0..3 avoided
    groups = {}
    for r in trace:
        groups.setdefault(r.prefix_id, []).append(ids[r.request_id])
    assert len(groups) == 2
    for members in groups.values():
        assert all(m[:80] == members[0][:80] for m in members)
        assert len({tuple(m[80:]) for m in members}) == len(members)  # unique parts differ
    first, second = list(groups.values())
    assert first[0][:80] != second[0][:80]
    r = trace[0]
    assert trace.prompt_token_ids(r, 1000, seed=5) == ids[r.request_id]
    assert trace.prompt_token_ids(r, 1000, seed=6) != ids[r.request_id]


def test_chatbot_turn_prompt_starts_with_previous_prompt_and_answer():
    trace = make_trace("chatbot", num_requests=300, seed=4, mean_turns=5.0)
    by_key = {(r.conversation_id, r.turn): r for r in trace}
    checked_shared = checked_truncated = 0
    for r in trace:
        ids = trace.prompt_token_ids(r, vocab_size=32000)
        assert len(ids) == r.prompt_len
        prev = by_key.get((r.conversation_id, r.turn - 1))
        if prev is None:
            continue
        history = trace.prompt_token_ids(prev, 32000) + trace.output_token_ids(prev, 32000)
        if r.prefix_len:
            assert r.prefix_len == len(history) and ids[: len(history)] == history
            checked_shared += 1
        else:  # truncated: the window slid, it ends with the history's tail and the new message
            assert r.prompt_len == 1024 and ids[:8] != history[:8]
            checked_truncated += 1
    assert checked_shared > 10 and checked_truncated > 10


def test_stored_ids_win():
    trace = mixed_trace()
    assert trace.prompt_token_ids(trace[1], vocab_size=10) == [7, 8, 9]


def test_streams_seeded_at_once_equal_numpy_and_random_ids(monkeypatch):
    # pcg64_states writes out numpy's SeedSequence and PCG64 seeding for many seeds at once; Streams
    # (a trace's prompt streams) gives random_ids' very ids, in order, out of order and for a name
    # it was not given.
    import random

    import numpy as np

    from workloads import tokens

    rng = random.Random(3)
    entropies = [rng.getrandbits(128) for _ in range(300)] + [0, 1, 2**32, 2**64 - 1, 2**127 + 5]
    entropies += [rng.getrandbits(rng.randint(1, 127)) for _ in range(300)]
    for e, (state, inc) in zip(entropies, tokens.pcg64_states(entropies)):
        expected = np.random.PCG64(e).state["state"]
        assert (state, inc) == (expected["state"], expected["inc"])
    monkeypatch.setattr(tokens, "STREAMS_AT_ONCE", 7)
    names = [("prompt", f"r{i}") for i in range(30)]
    streams = tokens.Streams(5, names)
    order = list(range(30)) + [3, 29, 12] + list(range(10, 20))
    for i in order:
        got = streams.random_ids(1000, 20 + i, *names[i])
        assert got.tolist() == tokens.random_ids(1000, 20 + i, 5, *names[i]).tolist()
    unnamed = streams.random_ids(50, 9, "answer", "r1")
    assert unnamed.tolist() == tokens.random_ids(50, 9, 5, "answer", "r1").tolist()


def test_streams_seed_each_block_once_however_far_back_a_turn_reads(monkeypatch):
    # a turn sent long after its trace time reads its history's streams far behind the newest ones: a block
    # dropped from the two kept is not seeded again (its streams alone are), so reading back and forth costs
    # one block's seeding each time no more
    from workloads import tokens

    monkeypatch.setattr(tokens, "STREAMS_AT_ONCE", 7)
    seeded = []
    monkeypatch.setattr(tokens, "pcg64_states", lambda entropies, real=tokens.pcg64_states:
                        seeded.append(len(entropies)) or real(entropies))
    names = [("prompt", f"r{i}") for i in range(70)]
    streams = tokens.Streams(5, names)
    for i in list(range(70)) + [0, 69, 1, 68, 2, 67] * 5:
        assert streams.random_ids(1000, 5, *names[i]).tolist() == tokens.random_ids(1000, 5, 5, *names[i]).tolist()
    assert seeded == [7] * 10
