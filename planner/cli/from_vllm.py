"""An operator's `vllm serve` and `vllm bench serve` command lines as the planner's `simulate` line.

The planner takes vLLM's own names for most settings (docs/vllm.md), so a command line mostly carries over
word for word; this module does the rest: the flags named otherwise (`-tp`, `--num-gpu-blocks-override`,
`--max-concurrency`, ...), the JSON configs (`--speculative-config`, `--eplb-config`), vLLM bench's
datasets and defaults (vllm/benchmarks/datasets/arg_utils.py: the `random` dataset, 1,000 prompts, seed 0)
and its `--goodput`. A flag with no effect on the numbers (a port, a log level) is left out and said so; a
flag the planner does not model is left out with a warning; an unknown flag is refused in one line.
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from planner.documents import read_json
from planner.errors import PlannerError
from planner.sim.clients import SERVED_TURNAROUND
from workloads.clients import CONVERSATION_SAMPLING

# `vllm serve` flags the planner spells the same, each taking a value
SERVE_VALUED = ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--long-prefill-token-threshold",
                "--gpu-memory-utilization", "--swap-space", "--block-size", "--kv-cache-dtype", "--quantization",
                "--dtype", "--scheduling-policy", "--performance-mode", "--all2all-backend", "--moe-backend",
                "--dbo-decode-token-threshold", "--dbo-prefill-token-threshold", "--kv-cache-memory-bytes",
                "--max-loras", "--max-lora-rank", "--kv-offloading-size", "--kv-offloading-backend",
                "--cpu-offload-gb", "--stream-interval")
SERVE_RENAMED = {"--tensor-parallel-size": "--tp", "-tp": "--tp", "--pipeline-parallel-size": "--pp", "-pp": "--pp",
                 "--data-parallel-size": "--dp", "-dp": "--dp", "--num-gpu-blocks-override": "--num-gpu-blocks",
                 "-q": "--quantization", "--kv-cache-memory": "--kv-cache-memory-bytes"}
SERVE_SWITCHES = ("--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
                  "--no-enable-chunked-prefill", "--async-scheduling", "--no-async-scheduling",
                  "--enable-expert-parallel", "--enable-eplb", "--enable-dbo", "--disable-custom-all-reduce",
                  "--enable-lora")
# what serves requests but does not change how fast: left out, and said so
SERVE_IGNORED_VALUED = ("--host", "--port", "--served-model-name", "--api-key", "--chat-template", "--tokenizer",
                        "--tokenizer-mode", "--download-dir", "--seed", "--uvicorn-log-level", "--tool-call-parser",
                        "--reasoning-parser", "--generation-config", "--revision", "--load-format", "--max-log-len",
                        "--root-path", "--allowed-origins", "--response-role", "--config-format", "--hf-token",
                        "--default-chat-template-kwargs", "--limit-mm-per-prompt", "--distributed-executor-backend",
                        "--max-parallel-loading-workers", "--otlp-traces-endpoint", "--override-generation-config",
                        "--structured-outputs-config", "--guided-decoding-backend", "--data-parallel-address",
                        "--data-parallel-rpc-port")
SERVE_IGNORED_SWITCHES = ("--trust-remote-code", "--disable-log-requests", "--enable-log-requests",
                          "--disable-log-stats", "--enable-auto-tool-choice", "--disable-fastapi-docs",
                          "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
                          "--enable-force-include-usage", "--language-model-only", "--calculate-kv-scales",
                          "--enable-sleep-mode", "--headless")
# what changes the numbers in ways the planner does not model (docs/vllm.md): left out with a warning
SERVE_NOT_MODELLED_VALUED = ("--compilation-config", "-O",
                             "--max-cpu-loras", "--lora-dtype", "--cuda-graph-sizes",
                             "--max-cudagraph-capture-size", "--attention-backend",
                             "--api-server-count", "--hf-overrides", "--rope-scaling", "--max-num-partial-prefills",
                             "--max-long-partial-prefills")
SERVE_NOT_MODELLED_SWITCHES = ("--enforce-eager", "--fully-sharded-loras")
# flags that take one or more values (argparse's nargs="+"): `vllm serve --lora-modules NAME=PATH ...` (the
# adapters served: which each request uses is the bench's), `vllm bench serve --lora-modules NAME ...`
MANY_VALUED = ("--lora-modules",)

# `vllm bench serve`: the planner's load flags and -p parameters
BENCH_DATASET_PARAMS = {
    "random": {"--random-input-len": "input_len", "--random-output-len": "output_len",
               "--random-range-ratio": "range_ratio", "--random-prefix-len": "prefix_len"},
    "prefix_repetition": {"--prefix-repetition-prefix-len": "prefix_len", "--prefix-repetition-suffix-len":
                          "suffix_len", "--prefix-repetition-num-prefixes": "num_prefixes",
                          "--prefix-repetition-output-len": "output_len"},
    # vLLM's TxtSlicesDataset: each prompt random_input_len tokens sliced from a text at a random start, each
    # output random_output_len: the random workload's lengths at range ratio 0 (slices of a text share no
    # prefix, so its words change nothing here); it reads neither --random-range-ratio nor --random-prefix-len
    "txt-slices": {"--random-input-len": "input_len", "--random-output-len": "output_len"},
}
BENCH_WORKLOADS = {"txt-slices": "random"}      # the planner's workload of a dataset of another name
TXT_SLICES_UNREAD = ("--dataset-path", "--random-range-ratio", "--random-prefix-len")
BENCH_LOAD = {"--num-prompts": "--requests", "--request-rate": "--rate", "--burstiness": "--burstiness",
              "--max-concurrency": "--concurrency", "--seed": "--seed", "--ramp-up-strategy": "--ramp-up-strategy",
              "--ramp-up-start-rps": "--ramp-up-start-rps", "--ramp-up-end-rps": "--ramp-up-end-rps"}
BENCH_IGNORED_VALUED = ("--model", "--tokenizer", "--backend", "--endpoint", "--endpoint-type", "--base-url",
                        "--host", "--port", "--result-dir", "--result-filename", "--percentile-metrics",
                        "--metric-percentiles", "--label", "--served-model-name", "--ready-check-timeout-sec",
                        "--request-id-prefix", "--extra-body", "--metadata", "--tokenizer-mode",
                        "--temperature", "--top-p", "--top-k", "--num-warmups")
BENCH_IGNORED_SWITCHES = ("--save-result", "--save-detailed", "--ignore-eos", "--disable-tqdm", "--trust-remote-code",
                          "--append-result", "--disable-shuffle", "--no-oversample", "--skip-chat-template",
                          "--profile")
# a dataset file's flags, as `planner workload import` takes them
IMPORTED = {"sharegpt": {"--sharegpt-output-len": "--output-len"}, "custom": {"--custom-output-len": "--output-len"},
            "sonnet": {"--sonnet-input-len": "--input-len", "--sonnet-output-len": "--output-len",
                       "--sonnet-prefix-len": "--prefix-len"},
            "burstgpt": {}}
TEXT_DATASETS = ("sharegpt", "custom", "sonnet")   # prompts as text: counted by the model's tokenizer
GOODPUT_METRICS = {"ttft": "ttft_p99", "tpot": "tpot_p99", "e2el": "e2e_p99"}
# vLLM's multi-turn benchmark (benchmarks/multi_turn/benchmark_serving_multi_turn.py): its short flags' long
# names, what changes nothing here, and the defaults the planner models (other values are left out)
MULTI_TURN_SCRIPT = "benchmark_serving_multi_turn.py"
MULTI_TURN_SHORT = {"-i": "--input-file", "-o": "--output-file", "-m": "--model", "-u": "--url", "-p": "--num-clients",
                    "-k": "--max-active-conversations", "-n": "--max-num-requests", "-e": "--excel-output",
                    "-v": "--verbose"}
MULTI_TURN_IGNORED_VALUED = ("--output-file", "--url", "--api-key", "--header", "--served-model-name",
                             "--max-retries", "--request-timeout-sec", "--stats-json-output")
MULTI_TURN_IGNORED_SWITCHES = ("--no-early-stop", "--verify-output", "--no-stream", "--send-conversation-id",
                               "--excel-output", "--verbose", "--print-content", "--trust-remote-code")
# vLLM bench's LoRA flags, as every workload's parameters (workloads/make.py LORA_PARAMS); --lora-modules gives
# the count of adapters it names
BENCH_LORA_PARAMS = {"--lora-modules": "loras", "--lora-assignment": "lora_assignment"}


@dataclass
class Translation:
    """The planner's words for a pair of vLLM command lines, and what was left out on the way."""

    words: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)        # no effect on the numbers
    not_modelled: list[str] = field(default_factory=list)   # changes them; left out with a warning
    verb: str = "simulate"                                  # validate (a recorded run) or capacity
    searched: list[str] = field(default_factory=list)       # the load a capacity search finds instead
    before: list[list[str]] = field(default_factory=list)   # planner commands to run first (an import)

    @property
    def command(self) -> str:
        return shlex.join(["planner", self.verb, *self.words])


def _flags(command: str, after: tuple[str, ...], what: str) -> list[str]:
    """The words after the program and its subcommand ("vllm serve", "vllm bench serve", or an api_server module),
    `--flag=value` split in two and underscores in flag names read as dashes, as vLLM's parser reads them."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise PlannerError(f"{what}: cannot split the command line: {exc}") from None
    for i, word in enumerate(words):
        if word in after or word.endswith(("api_server", MULTI_TURN_SCRIPT)):
            words = words[i + 1:]
            break
    out = []
    for word in words:
        if word.startswith("-") and not _is_number(word):
            name, sep, value = word.partition("=")
            out += [name.replace("_", "-")] + ([value] if sep else [])
        else:
            out.append(word)
    return out


def _values(words: list[str], i: int, what: str) -> list[str]:
    """The one or more values of the many-valued flag at `i`."""
    values = []
    for word in words[i + 1:]:
        if word.startswith("--"):
            break
        values.append(word)
    if not values:
        raise PlannerError(f"{what}: {words[i]} needs at least one value")
    return values


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _same(a: str, b: str) -> bool:
    """The same value, numbers compared as numbers ("0" and "0.0")."""
    return float(a) == float(b) if _is_number(a) and _is_number(b) else a == b


def _value(words: list[str], i: int, what: str) -> str:
    if i + 1 >= len(words) or words[i + 1].startswith("--"):
        raise PlannerError(f"{what}: {words[i]} needs a value")
    return words[i + 1]


def _speculative(text: str) -> list[str]:
    """--speculative-config's JSON as --speculative METHOD:K (+ --draft-model)."""
    try:
        config = read_json(text)
    except ValueError as exc:
        raise PlannerError(f"vllm serve: --speculative-config is {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("num_speculative_tokens"), int):
        raise PlannerError("vllm serve: --speculative-config needs a JSON object with num_speculative_tokens")
    method = str(config.get("method") or ("draft_model" if config.get("model") else ""))
    k = config["num_speculative_tokens"]
    if method == "ngram":
        return ["--speculative", f"ngram:{k}"]
    if method.startswith("eagle"):
        return ["--speculative", f"eagle:{k}"]
    if method.endswith("mtp"):
        return ["--speculative", f"mtp:{k}"]
    if method == "draft_model" and config.get("model"):
        return ["--speculative", f"draft:{k}", "--draft-model", str(config["model"])]
    raise PlannerError(f"vllm serve: --speculative-config method {method!r} is not one the planner prices "
                       f"(ngram, eagle, eagle3, mtp, a draft model)")


def _eplb(text: str) -> list[str]:
    try:
        config = read_json(text)
    except ValueError as exc:
        raise PlannerError(f"vllm serve: --eplb-config is {exc}") from None
    redundant = config.get("num_redundant_experts") if isinstance(config, dict) else None
    return [] if redundant is None else ["--num-redundant-experts", str(redundant)]


def _kv_transfer(text: str, out: Translation) -> None:
    """--kv-transfer-config's JSON: vLLM's OffloadingConnector with its CPU tier's size in bytes
    (`cpu_bytes_to_use`, what --kv-offloading-size sets) as --kv-offloading-size; any other connector (LMCache,
    disaggregated serving's), a tiered or differently blocked tier, is left out with a warning."""
    try:
        config = read_json(text)
    except ValueError as exc:
        raise PlannerError(f"vllm serve: --kv-transfer-config is {exc}") from None
    if not isinstance(config, dict) or config.get("kv_connector") != "OffloadingConnector":
        out.not_modelled.append("--kv-transfer-config")
        return
    extra = config.get("kv_connector_extra_config") or {}
    size = extra.get("cpu_bytes_to_use") if isinstance(extra, dict) else None
    if not isinstance(size, (int, float)) or isinstance(size, bool) or size <= 0:
        raise PlannerError("vllm serve: --kv-transfer-config's OffloadingConnector: give the CPU tier's size as "
                           "kv_connector_extra_config's cpu_bytes_to_use (or --kv-offloading-size GIB); a size in "
                           "blocks (num_cpu_blocks) depends on the model's block bytes")
    out.words += ["--kv-offloading-size", f"{size / 2**30:g}"]
    if set(extra) - {"cpu_bytes_to_use"}:       # block_size, spec_name, store_threshold, ...
        out.not_modelled.append("--kv-transfer-config's " + ", ".join(sorted(set(extra) - {"cpu_bytes_to_use"})))


def translate_serve(command: str, out: Translation) -> None:
    """`vllm serve MODEL ...`'s deployment flags, appended to `out`."""
    words = _flags(command, ("serve",), "vllm serve")
    i, model = 0, None
    while i < len(words):
        word = words[i]
        if not word.startswith("-"):
            if model is not None:
                raise PlannerError(f"vllm serve: a second model {word!r} (the model is {model!r})")
            model, i = word, i + 1
            continue
        if word == "--model":
            model, i = _value(words, i, "vllm serve"), i + 2
            continue
        if word in SERVE_VALUED or word in SERVE_RENAMED:
            out.words += [SERVE_RENAMED.get(word, word), _value(words, i, "vllm serve")]
            i += 2
        elif word in SERVE_SWITCHES:
            out.words.append(word)
            i += 1
        elif word in MANY_VALUED:
            out.ignored.append(word)
            i += 1 + len(_values(words, i, "vllm serve"))
        elif word in ("--speculative-config", "--eplb-config"):
            out.words += (_speculative if word == "--speculative-config" else _eplb)(_value(words, i, "vllm serve"))
            i += 2
        elif word == "--kv-transfer-config":
            _kv_transfer(_value(words, i, "vllm serve"), out)
            i += 2
        elif word in SERVE_IGNORED_VALUED or word in SERVE_NOT_MODELLED_VALUED:
            (out.ignored if word in SERVE_IGNORED_VALUED else out.not_modelled).append(word)
            i += 2
        elif word in SERVE_IGNORED_SWITCHES or word in SERVE_NOT_MODELLED_SWITCHES:
            (out.ignored if word in SERVE_IGNORED_SWITCHES else out.not_modelled).append(word)
            i += 1
        else:
            raise PlannerError(f"vllm serve: {word} is not a flag the planner knows (docs/vllm.md lists those it "
                               f"models); drop it or check its spelling")
    if model is None:
        raise PlannerError("vllm serve: no model (vllm serve MODEL ...)")
    out.words[:0] = ["--model", model]


def translate_bench(command: str, out: Translation) -> None:
    """`vllm bench serve ...`'s load, appended to `out` (vLLM bench's defaults where a flag is not given)."""
    words = _flags(command, ("serve",), "vllm bench serve")
    dataset, params, load, slos, switches = "random", {}, {"--requests": "1000"}, [], set()
    given: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in BENCH_IGNORED_SWITCHES:
            switches.add(word)
            out.ignored.append(word)
            i += 1
        elif word == "--goodput":
            i += 1
            while i < len(words) and not words[i].startswith("--"):
                slos.append(_goodput(words[i]))
                i += 1
        elif word in MANY_VALUED:        # vLLM bench sends each request to one of these adapters
            adapters = _values(words, i, "vllm bench serve")
            params["--lora-modules"] = str(len(dict.fromkeys(adapters)))
            i += 1 + len(adapters)
        elif word.startswith("-"):
            given[word] = _value(words, i, "vllm bench serve")
            i += 2
        else:
            raise PlannerError(f"vllm bench serve: unexpected word {word!r}")
    if given.get("--dataset-name") == "txt-slices":
        for flag in TXT_SLICES_UNREAD:
            if given.pop(flag, None) is not None:
                out.ignored.append(flag)
    if "--dataset-path" in given:
        raise PlannerError(_import_hint(given, switches))
    for flag, value in given.items():
        if flag == "--dataset-name":
            dataset = value
        elif flag in BENCH_LOAD:
            load[BENCH_LOAD[flag]] = value
        elif any(flag in names for names in BENCH_DATASET_PARAMS.values()) or flag in BENCH_LORA_PARAMS:
            params[flag] = value
        elif flag in BENCH_IGNORED_VALUED:
            out.ignored.append(flag)
        else:
            raise PlannerError(f"vllm bench serve: {flag} is not a flag the planner knows (docs/vllm.md lists those "
                               f"it models); drop it or check its spelling")
    if dataset not in BENCH_DATASET_PARAMS:
        raise PlannerError(f"vllm bench serve: --dataset-name {dataset}: the planner generates "
                           f"{' and '.join(BENCH_DATASET_PARAMS)}; for a dataset file, import it (planner workload "
                           f"import) and simulate --trace")
    names = BENCH_DATASET_PARAMS[dataset] | BENCH_LORA_PARAMS
    stray = sorted(set(params) - set(names))
    if stray:
        raise PlannerError(f"vllm bench serve: {stray[0]} is not a parameter of --dataset-name {dataset}")
    out.words += ["--workload", BENCH_WORKLOADS.get(dataset, dataset)]
    for flag, value in params.items():
        out.words += ["-p", f"{names[flag]}={value}"]
    rate = load.pop("--rate", "inf")
    if not _is_number(rate):
        raise PlannerError(f"vllm bench serve: --request-rate {rate!r} is not a number of requests/s "
                           f"(inf: all at once)")
    if out.verb == "capacity":
        _searched(load, rate, out)
    elif not (math.isinf(float(rate)) and ("--concurrency" in load or "--ramp-up-strategy" in load)):
        out.words += ["--rate", rate]         # (inf and no limit: every request at once, as vLLM sends them)
    for flag, value in load.items():
        out.words += [flag, value]
    if "--concurrency" in load:               # vLLM bench's clients are an API server's
        out.words += ["--client-turnaround", str(SERVED_TURNAROUND)]
    if slos:
        out.words += ["--slo", ",".join(slos)]
    if "--ignore-eos" not in switches:
        out.not_modelled.append("no --ignore-eos (vLLM's outputs end at EOS; the planner generates each request's "
                                "whole output length)")


def translate_multi_turn(command: str, out: Translation) -> None:
    """vLLM's multi-turn benchmark line, appended to `out`: its input file imported turn by turn first (the
    tokenizer its --model names), then its clients' closed loop over that trace."""
    what = MULTI_TURN_SCRIPT
    words = [MULTI_TURN_SHORT.get(w, w) for w in _flags(command, (), what)]
    given: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in MULTI_TURN_IGNORED_SWITCHES:
            out.ignored.append(word)
            i += 1
        elif word == "--warmup-step":
            given[word] = ""
            i += 1
        elif word.startswith("-"):
            given[word] = _value(words, i, what)
            i += 2
        else:
            raise PlannerError(f"{what}: unexpected word {word!r}")
    for flag in ("--input-file", "--model"):
        if flag not in given:
            raise PlannerError(f"{what}: {flag} is required (as the benchmark requires it)")
    known = {"--input-file", "--model", "--num-clients", "--max-active-conversations", "--max-num-requests",
             "--max-turns", "--request-rate", "--seed", "--warmup-step", "--limit-max-tokens", "--limit-min-tokens",
             "--conversation-sampling", "--warmup-percentages", *MULTI_TURN_IGNORED_VALUED}
    for flag in given:
        if flag not in known:
            raise PlannerError(f"{what}: {flag} is not a flag the planner knows (docs/vllm.md lists those it "
                               f"models); drop it or check its spelling")
        if flag in MULTI_TURN_IGNORED_VALUED:
            out.ignored.append(flag)
    source = given["--input-file"]
    trace = f"{Path(source).stem}-turns.jsonl"
    # (its --seed draws a generation config's conversations: bench_dataset.py)
    imported = [w for flag in ("--max-turns", "--seed") if flag in given for w in (flag, given[flag])]
    imported += _answer_limit(given, out, what)
    out.before.append(["workload", "import", source, "--format", "conversations", "--tokenizer", given["--model"],
                       *imported, "-o", trace])
    clients = given.get("--num-clients", "1")
    out.words += ["--trace", trace, "--concurrency", "max" if out.verb == "capacity" else clients]
    if out.verb == "capacity":
        out.searched.append(f"--num-clients {clients}")
    if "--max-active-conversations" in given:
        out.words += ["--max-active-conversations", given["--max-active-conversations"]]
    if "--max-num-requests" in given:           # its limit in all, M // N a client (get_client_config)
        most = given["--max-num-requests"]
        if not most.isdigit() or not clients.isdigit() or int(clients) < 1 or int(most) // int(clients) < 1:
            raise PlannerError(f"{what}: --max-num-requests {most} over --num-clients {clients}: the benchmark "
                               f"needs at least one request a client")
        out.words += ["--client-max-requests", str(int(most) // int(clients))]
    rate = given.get("--request-rate", "0")       # its clients' own rate; 0: none
    if not _is_number(rate) or float(rate) < 0:
        raise PlannerError(f"{what}: --request-rate {rate!r} is not a number of requests/s per client")
    if 0 < float(rate) < math.inf:               # (an infinite one pauses none, as 0)
        out.words += ["--client-request-rate", rate]
    out.words += ["--client-turnaround", str(SERVED_TURNAROUND)]    # the benchmark's clients are a server's
    if "--no-early-stop" not in out.ignored:    # its default: every client stops when the first stops
        out.words.append("--client-early-stop")
    if "--warmup-step" in given:
        out.words.append("--client-warmup-step")
    sampling = given.get("--conversation-sampling", "round_robin")
    if sampling not in CONVERSATION_SAMPLING:
        raise PlannerError(f"{what}: --conversation-sampling {sampling!r}: choose {' or '.join(CONVERSATION_SAMPLING)}")
    if sampling != "round_robin":
        out.words += ["--conversation-sampling", sampling]
    out.words += _warmup_percent(given, out, what)
    if "--seed" in given:                       # its clients' generators too (client_main)
        out.words += ["--seed", given["--seed"]]
    out.not_modelled.append("the benchmark sends no ignore_eos: its answers end at EOS or at their max_tokens (the "
                            "dataset answer's length, or --limit-max-tokens), and the planner generates the whole "
                            "length")


def _warmup_percent(given: dict[str, str], out: Translation, what: str) -> list[str]:
    """`--client-warmup-percent X` for the multi-turn benchmark's --warmup-percentages X% (its statistics over
    the samples after the first X%); several values print a table each, of which the planner gives the first and
    warns; with its --warmup-step it ignores them, and so does the translation."""
    text = given.get("--warmup-percentages", "0%")
    try:
        values = [float(v.strip().removesuffix("%")) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(0 <= v < 100 for v in values):
        raise PlannerError(f"{what}: --warmup-percentages {text!r}: expected percentages from 0 up to 100, "
                           f"comma separated (as the benchmark requires)")
    if "--warmup-step" in given:
        if any(values):
            out.ignored.append("--warmup-percentages (the benchmark ignores it with --warmup-step)")
        return []
    values = sorted(values)                      # (the benchmark's tables go from the lowest)
    if len(values) > 1:
        out.not_modelled.append(f"--warmup-percentages {text}: one figure set a run; the planner's is the first "
                                f"table's ({values[0]:g}%): run it again with --client-warmup-percent P for each")
    return ["--client-warmup-percent", f"{values[0]:g}"] if values[0] else []


def _answer_limit(given: dict[str, str], out: Translation, what: str) -> list[str]:
    """The import's `--output-len` for the multi-turn benchmark's --limit-max-tokens (every request's
    max_tokens; its --limit-min-tokens is checked as it checks it, then not sent: get_client_config,
    send_request). 0 (its default) keeps the dataset's answer lengths; a negative value sends no limit."""
    low, high = (given.get(f"--limit-{end}-tokens", "0") for end in ("min", "max"))
    if not all(re.fullmatch(r"-?\d+", v) for v in (low, high)):
        raise PlannerError(f"{what}: --limit-min-tokens {low} --limit-max-tokens {high}: expected whole numbers")
    low, high = int(low), int(high)
    if low > 0 or high > 0:
        if low < 1 or high < 1 or low > high:
            raise PlannerError(f"{what}: --limit-min-tokens {low} --limit-max-tokens {high}: the benchmark needs "
                               f"both, at least 1, the minimum no larger")
        if "--limit-min-tokens" in given:
            out.ignored.append("--limit-min-tokens")    # (computed, never sent: its payload line is commented out)
        return ["--output-len", str(high)]
    if high < 0:
        out.not_modelled.append(f"--limit-max-tokens {high} (no max_tokens: answers run to EOS or the context)")
    return []


def _searched(load: dict[str, str], rate: str, out: Translation) -> None:
    """`planner capacity` searches the load the bench line fixed: the most clients within the SLOs when it ran
    clients (--max-concurrency), else the highest Poisson (or --burstiness) rate; what it fixed is left out."""
    fixed = [f"--request-rate {rate}"] if not math.isinf(float(rate)) else []
    for flag in ("--ramp-up-strategy", "--ramp-up-start-rps", "--ramp-up-end-rps"):
        if flag in load:
            fixed.append(f"{flag} {load.pop(flag)}")
    if "--concurrency" in load:
        fixed.append(f"--max-concurrency {load['--concurrency']}")
        load["--concurrency"] = "max"
        if "--burstiness" in load:
            fixed.append(f"--burstiness {load.pop('--burstiness')}")
    out.searched += fixed


def _import_hint(given: dict[str, str], switches: set[str]) -> str:
    """A dataset file's refusal, with the `planner workload import` line that samples it as vLLM bench does."""
    dataset, path = given.get("--dataset-name", "random"), given["--dataset-path"]
    if dataset not in IMPORTED:
        return (f"vllm bench serve: --dataset-name {dataset} --dataset-path {path}: the planner imports "
                f"{', '.join(IMPORTED)} files (planner workload import), not {dataset}")
    words = ["planner", "workload", "import", path, "--format", dataset,
             *(["--tokenizer", "MODEL_DIR"] if dataset in TEXT_DATASETS else []),
             "-n", given.get("--num-prompts", "1000"), "--seed", given.get("--seed", "0")]
    for flag, value in given.items():
        if flag in IMPORTED[dataset]:
            words += [IMPORTED[dataset][flag], value]
    if dataset in ("sharegpt", "custom"):     # (vLLM's sonnet and BurstGPT datasets ignore these switches)
        words += [flag for flag in ("--skip-chat-template", "--no-oversample", "--disable-shuffle")
                  if flag in switches and (dataset == "custom" or flag != "--skip-chat-template")]
    return (f"vllm bench serve: --dataset-path {path}: import the file first ({shlex.join(words)} -o trace.jsonl) "
            f"and simulate --trace trace.jsonl")


def _goodput(pair: str) -> str:
    """vLLM bench's --goodput KEY:MS as the planner's SLO (per request, judged on p99 too)."""
    key, sep, ms = pair.partition(":")
    if not sep or key not in GOODPUT_METRICS or not _is_number(ms):
        raise PlannerError(f"vllm bench serve: --goodput {pair!r}: expected ttft:MS, tpot:MS or e2el:MS")
    return f"{GOODPUT_METRICS[key]}={float(ms) / 1000:g}"


def translate(serve: str, bench: str | None, gpu: str, measured: str | None = None,
              capacity: bool = False) -> Translation:
    """The `planner simulate` words for `vllm serve` (and `vllm bench serve`) on `gpu`; with `measured` (the
    result file of `vllm bench serve --save-result --save-detailed`), `planner validate --measured` instead:
    the recorded requests, replayed at their send times, against the server's simulation; with `capacity`,
    `planner capacity`: the most load of the bench's kind within its --goodput SLOs."""
    if bench is not None and measured is not None:
        raise PlannerError("give --bench (to simulate its load) or --measured (to validate against its "
                           "recording), not both: a recording holds its own load")
    if capacity and measured is not None:
        raise PlannerError("--capacity searches for the most load; a recording (--measured) holds the load it ran")
    out = Translation(verb="capacity" if capacity else "simulate")
    translate_serve(serve, out)
    out.words[2:2] = ["--gpu", gpu]
    if bench is not None and MULTI_TURN_SCRIPT in bench:
        translate_multi_turn(bench, out)
    elif bench is not None:
        translate_bench(bench, out)
    if measured is not None:
        out.verb = "validate"
        out.words += ["--measured", measured]
    return out
