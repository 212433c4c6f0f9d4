"""`planner serve` (an OpenAI-compatible server over the engine) and `planner bench` (a trace-replay load client)."""
from __future__ import annotations

from typing import Optional

import typer

from planner.cli_common import fail
from planner.errors import PlannerError


def serve(
    model: str = typer.Option(..., help="a local model folder, or a catalog model (random weights, "
                                        "byte-level tokenizer)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, help="port to listen on"),
    served_model_name: Optional[str] = typer.Option(None, help="the name clients send as `model` "
                                                               "(default: the --model value)"),
    block_size: int = typer.Option(16, help="KV-cache block size (tokens)"),
    num_gpu_blocks: Optional[int] = typer.Option(None, help="KV blocks (default: from the memory budget)"),
    gpu_memory_utilization: float = typer.Option(0.9, help="fraction of device memory the engine may use"),
    swap_space: float = typer.Option(4.0, help="CPU swap space per device (GiB)"),
    max_num_seqs: int = typer.Option(256, help="most sequences in a batch"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, help="most tokens in a step"),
    max_model_len: Optional[int] = typer.Option(None, help="context limit (default: the model's)"),
    preemption_mode: str = typer.Option("recompute", help="recompute | swap"),
    enable_prefix_caching: bool = typer.Option(False, "--enable-prefix-caching/--no-enable-prefix-caching",
                                               help="reuse KV blocks of shared prompt prefixes"),
    chunked_prefill: bool = typer.Option(False, "--chunked-prefill", help="vLLM v1's chunked-prefill scheduler"),
    tp: int = typer.Option(1, "--tp", help="tensor parallel size (this engine runs on one device: 1)"),
    dtype: str = typer.Option("auto", help="auto | float32 | float16 | bfloat16"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    seed: int = typer.Option(0, help="seed of requests that bring none"),
    log_level: str = typer.Option("warning", help="uvicorn's log level"),
) -> None:
    """Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /metrics)."""
    from engine.llm_engine import LLMEngine
    from planner.models_cache import model_folder
    from planner.serve.server import make_server

    if tp != 1:
        raise fail(f"--tp {tp} is not supported: this engine runs a model on one device (use --tp 1; "
                   f"`planner simulate --tp {tp}` models tensor parallelism)")
    extra = {"enable_chunked_prefill": True} if chunked_prefill else {}
    try:
        folder, _ = model_folder(model)
        engine = LLMEngine(folder, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                           gpu_memory_utilization=gpu_memory_utilization, swap_space=swap_space,
                           preemption_mode=preemption_mode, enable_prefix_caching=enable_prefix_caching,
                           max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           max_model_len=max_model_len, dtype=dtype, device=device, seed=seed, **extra)
    except TypeError as exc:   # an engine without this option (e.g. chunked prefill not built in)
        raise fail(f"unsupported engine option: {exc}") from None
    except (PlannerError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    name = served_model_name or model
    typer.echo(f"serving {name} on http://{host}:{port}/v1 ({engine.runner.num_gpu_blocks} KV blocks of "
               f"{block_size}, max_model_len {engine.max_model_len})", err=True)
    make_server(engine, name, folder, host, port, log_level).run()
