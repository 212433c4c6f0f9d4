"""Server output-token throughput against offline ``LLM.generate`` on the same requests (issue 12: >= 0.85x).

The same random-weight model and the same requests (token-id prompts, greedy,
``ignore_eos`` so every output has its requested length) run twice each,
alternating: offline through ``LLM.generate`` in this process, and through
`planner serve` in a subprocess driven by `planner bench`'s client (all
requests sent at once, streaming). Throughput = output tokens / wall time
from the first request to the last token. Both sides warm up first.

The bench also prints tokens per CPU-second of the serving process (this
process for offline runs, the server's process for served ones; the load
client's CPU is not counted). On an oversubscribed machine the server's steps,
which run on a worker thread, were measured 2-3x cheaper than the same steps
on the main thread of an offline run; ``--threads 1`` runs both sides
single-threaded for a like-for-like comparison.

    .venv/bin/python bench/bench_server.py [--model opt-125m --requests 64 --output-len 64 --rounds 2]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from planner.profile.checkpoints import model_folder  # noqa: E402
from planner.bench.client import BenchConfig, run_bench  # noqa: E402
from engine.entrypoints.openai.server import free_port  # noqa: E402
from workloads import Trace, TraceRequest  # noqa: E402


def make_trace(n: int, output_len: int, seed: int) -> Trace:
    import random
    rng = random.Random(seed)
    reqs = [TraceRequest(request_id=str(i), arrival_time=0.0, prompt_len=rng.randint(16, 96), output_len=output_len)
            for i in range(n)]
    return Trace(reqs, name="bench-server")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def offline(llm: LLM, prompts, output_len: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second)."""
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    cpu0, start = cpu_seconds(os.getpid()), time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall, cpu = time.perf_counter() - start, cpu_seconds(os.getpid()) - cpu0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / wall, tokens / cpu


def served(url: str, trace: Trace, server_pid: int) -> tuple[float, float]:
    cpu0 = cpu_seconds(server_pid)
    results, _ = run_bench(trace, BenchConfig(url, vocab_size=256))
    cpu = cpu_seconds(server_pid) - cpu0
    failed = [r for r in results if not r.success]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed: {failed[0].error}")
    first = min(r.start for r in results)
    last = max(r.start + r.latency for r in results)
    tokens = sum(r.output_len for r in results)
    return tokens / (last - first), tokens / cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="opt-125m")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads on both sides (default: torch's own choice)")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
        env["OMP_NUM_THREADS"] = str(args.threads)

    folder, _ = model_folder(args.model)
    trace = make_trace(args.requests, args.output_len, args.seed)
    prompts = [trace.prompt_token_ids(r, 256, args.seed) for r in trace]
    engine_args = ["--block-size", "16", "--max-num-seqs", str(args.requests), "--seed", "0"]
    llm = LLM(folder, block_size=16, max_num_seqs=args.requests)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "from planner.cli.app import main; main()", "serve",
                               "--model", folder, "--port", str(port), *engine_args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start: {server.stderr.read().decode()[-2000:]}")
            time.sleep(0.5)
        warm = make_trace(4, 4, args.seed + 1)
        offline(llm, [trace.prompt_token_ids(r, 256, 1) for r in warm], 4)
        served(url, warm, server.pid)
        rows = []
        for i in range(args.rounds):
            off, off_cpu = offline(llm, prompts, args.output_len)
            srv, srv_cpu = served(url, trace, server.pid)
            rows.append((off, srv, off_cpu, srv_cpu))
            print(f"round {i + 1}: offline {off:7.1f} tok/s ({off_cpu:7.1f} tok/CPU-s)   server {srv:7.1f} tok/s "
                  f"({srv_cpu:7.1f} tok/CPU-s)   ratio wall {srv / off:.3f}, CPU {srv_cpu / off_cpu:.3f}", flush=True)
        wall_ratio = sorted(r[1] / r[0] for r in rows)[len(rows) // 2]
        cpu_ratio = sorted(r[3] / r[2] for r in rows)[len(rows) // 2]
        print(f"{args.model}, {args.requests} requests x {args.output_len} output tokens, {args.rounds} rounds: "
              f"median server/offline ratio: wall {wall_ratio:.3f}, per CPU-second {cpu_ratio:.3f} "
              f"(target >= 0.85)")
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
