"""Which pool binds a disaggregated run (prefill or decode), in plain words for the verdict.

A pool is saturated when its requests queue longer than the work they queue for:
- the prefill pool is compute-bound: saturated when the mean wait for a prefill
  replica exceeds the mean prefill itself; its pressure is how busy its replicas
  are (busy time / replicas x run time);
- the decode pool runs whenever it holds a request, so being busy says nothing;
  it is saturated when a request handed to it waits for blocks (admission) and
  then for a seat in the batch (start) longer than DECODE_QUEUE_STEPS of its own
  decode steps; its pressure is the larger of its KV-cache use and its batch
  against max_num_seqs.
The binding pool is the saturated one (both: the longer wait); when neither
queues, the pool under more pressure is named as the nearer its limit.
"""
from __future__ import annotations

DECODE_QUEUE_STEPS = 5     # a hand-off costs about one step of waiting (the step in progress, then the next)
PD_NOTE = ("P/D: the proxy's and the network's latency, and transfers sharing a link (each runs at the link's full "
           "bandwidth)")


def which_binds(pd: dict) -> dict:
    """result.json's verdict `pd`: the binding pool, whether it is saturated, and each pool's reading."""
    prefill, decode = pd["prefill"], pd["decode"]
    prefill_wait = prefill["queue_wait"]["mean"] or 0.0
    prefill_work = prefill["prefill_time"]["mean"] or 0.0
    decode_wait = (decode["admission_wait"]["mean"] or 0.0) + (decode["start_wait"]["mean"] or 0.0)
    step = decode["tpot"]["mean"] or decode["first_step"]["mean"] or 0.0
    prefill_full = prefill_wait > prefill_work > 0
    decode_full = step > 0 and decode_wait > DECODE_QUEUE_STEPS * step
    batch = (decode["mean_batch_size"] or 0.0) / decode["max_num_seqs"]
    pressure = {"prefill": prefill["utilization"] or 0.0, "decode": max(decode["kv_utilization"] or 0.0, batch)}
    if prefill_full != decode_full:
        binds = "prefill" if prefill_full else "decode"
    elif prefill_full:
        binds = "prefill" if prefill_wait >= decode_wait else "decode"
    else:
        binds = max(pressure, key=pressure.get)
    return {"binds": binds, "saturated": prefill_full or decode_full, "prefill_saturated": prefill_full,
            "decode_saturated": decode_full, "prefill_wait": prefill_wait, "decode_wait": decode_wait,
            "pressure": pressure, "decode_batch_fill": batch}


def _replica(pool: dict) -> str:
    """`2 x (h200 x1 x dp16)`: the pool's replicas and each one's GPUs."""
    dp = pool.get("deployment", {}).get("dp", 1)
    return f"{pool['replicas']} x ({pool['gpu']} x{pool['tp']}{f' x dp{dp}' if dp > 1 else ''})"


def pd_line(pd: dict, found: dict) -> str:
    """The verdict's line: the ratio, the binding pool and why, both pools' readings, the transfer."""
    prefill, decode, kv = pd["prefill"], pd["decode"], pd["kv_transfer"]
    shape = f"P/D {pd['ratio']} (prefill {_replica(prefill)}, decode {_replica(decode)})"
    if found["saturated"]:
        why = ("longer than their prefill takes" if found["binds"] == "prefill" else
               f"longer than {DECODE_QUEUE_STEPS} decode steps")
        head = f"the {found['binds']} pool binds: its requests queue {why}"
        hint = f"; more {found['binds']} replicas shorten the queue"
    else:
        head = f"neither pool queues; the {found['binds']} pool is nearer its limit"
        hint = ""
    readings = (f"prefill: {found['pressure']['prefill']:.0%} busy, wait {found['prefill_wait'] * 1e3:.0f} ms for a "
                f"replica (mean) against {(prefill['prefill_time']['mean'] or 0) * 1e3:.0f} ms of prefill; decode: "
                f"KV cache {decode['kv_utilization'] or 0:.0%} used, batch {decode['mean_batch_size'] or 0:.0f} of "
                f"{decode['max_num_seqs']}, wait {found['decode_wait'] * 1e3:.0f} ms for blocks and a seat")
    seconds = kv["seconds"]["mean"]
    transfer = ("" if seconds is None else
                f"; KV transfer {seconds * 1e3:.1f} ms mean ({kv['bytes']['mean'] / 1e9:.2f} GB over {kv['link']})")
    return f"{shape}: {head}{hint} ({readings}){transfer}"


def with_pd_verdict(verdict: dict, pd: dict) -> dict:
    """The run's verdict with the pools' reading first among its lines."""
    found = which_binds(pd)
    return {**verdict, "pd": found, "lines": [pd_line(pd, found), *verdict.get("lines", [])]}
