"""`planner search`: which GPU, TP, block size and batch limit serve this traffic within the SLOs, cheapest.

Every configuration of the grid gets the capacity search of `planner capacity`
and a price; the result is the cheapest configuration that reaches --rate (or,
with --rate max, the most capacity per dollar), a CSV table of all of them, a
Pareto plot of cost against capacity, and with --json one document on stdout.
"""
from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from planner import api
from planner.cli import options as opt
from planner.cli import pd_options as pdo
from planner.cli import pd_search
from planner.cli.options import DeploymentChoices, deployment_options
from planner.cli.output import fail, run_folder
from planner.cli.simulate import load_of
from planner.cost.linear import parse_linear
from planner.cost.nodes import node_link
from planner.cost.select import parse_cost_model
from planner.deploy.parallel import layout_suffix
from planner.errors import PlannerError
from planner.runs.pools import EXECUTORS, check_executor
from planner.runs.slos import parse_slos
from planner.runs.spec import RunSpec
from planner.sizing.prices import parse_price_overrides
from planner.sizing.layouts import layouts_for, search_layouts
from planner.sizing.speculation import summary_lines as speculation_lines
from planner.sizing.search import MAX_REPLICAS, SearchGrid, check_fleet, every_refused, fleet_label, plot_pareto
from workloads import TraceError


def _rate(text: str) -> float | None:
    if text.strip().lower() == "max":
        return None
    try:
        rate = float(text)
    except ValueError:
        raise PlannerError(f"--rate: {text!r} is neither a number of requests/s nor 'max'") from None
    if not rate > 0:
        raise PlannerError(f"--rate must be > 0 requests/s, got {text}")
    return rate


def _replicas(text: str) -> tuple[int, ...] | str:
    """--replicas: 'auto', or a comma list of counts (an axis of the grid)."""
    if text.strip().lower() == "auto":
        return "auto"
    counts = opt.replica_counts(text)
    return counts


# A fleet search's options (this command's own: simulate and capacity take one --replicas count or a list).
REPLICAS = typer.Option(None, "--replicas", metavar="K,...|auto",
                        help="search fleets: each configuration as K replicas behind --router, for every K of a "
                             "comma list (an axis of the grid), or 'auto': the fewest replicas of each "
                             "configuration that meet the SLOs at --rate (doubling, then bisection); a fleet "
                             "costs replicas x TP x the GPU's $/hour")
ROUTER = typer.Option(None, "--router", metavar="POLICY",
                      help="with --replicas: how the fleet's router picks a replica (default round-robin; "
                           "see `planner simulate --help`)")
MAX_REPLICAS_OPTION = typer.Option(MAX_REPLICAS, "--max-replicas", help="with --replicas auto: the most "
                                                                         "replicas tried")


# The grid's axes and their defaults; every other deployment setting takes one value. max_num_seqs None:
# the policy's own for each GPU (vllm-v1: vLLM's API server default, 1024 on an H100, 256 on an A100).
AXES = {"gpu": ("a100-80g", "h100-sxm"), "tp": (1, 2, 4), "block_size": (16,), "max_num_seqs": (None,)}
# A MoE's layouts (planner/sizing/layouts.py): each one a grid of the axes above.
LAYOUT_AXES = ("dp", "enable_expert_parallel")


SLOS = typer.Option(..., "--slo", help="SLOs, METRIC=SECONDS, comma-separated or repeated (e.g. "
                                       "ttft_p99=2,tpot_p99=0.1); a bare number is normalized latency in s/token")
TARGET_CLIENTS = typer.Option(None, "--concurrency", metavar="N",
                              help="target N concurrent clients (a closed loop) instead of a request rate: each "
                                   "configuration's capacity is the most clients it serves within the SLOs")
PD = typer.Option(None, "--pd", metavar="auto|P:D,...",
                  help="compare prefill/decode disaggregation with aggregated serving at --rate: auto finds each "
                       "configuration's cheapest P:D, or a list of P:D (docs/pd.md)")
PLAIN = typer.Option(False, "--plain", help="search every configuration from scratch with full simulations (no "
                                             "hints, early stops or shared runs): slower, the reference the "
                                             "default search is tested against")
EXECUTOR = typer.Option("local", "--executor", help=f"where simulations run: {' or '.join(EXECUTORS)}")
WORKERS = typer.Option(None, "--workers", help="processes (local) or CPUs of a new local Ray (default: all cores)")
RAY_ADDRESS = typer.Option(None, "--ray-address", help="join this Ray cluster ('auto': the one running here)")


def _fleet_of(spec: RunSpec, replicas: str | None, router: str | None) -> tuple[RunSpec, tuple | str | None]:
    """The fleet axis of a search (None: lone deployments; replica counts; or "auto") and the router."""
    fleet = None if replicas is None else _replicas(replicas)
    if fleet is None and router is not None:
        raise PlannerError("--router picks a replica of a fleet: give --replicas K,... or --replicas auto")
    if fleet is not None and router is not None:
        spec = spec.with_fleet(router=router)
    return spec, fleet


def _fleet_grid(spec: RunSpec, axes: dict, slos: dict, target, *, clients: bool, tolerance: float,
                max_rate: float, plain: bool, fleet, max_replicas: int) -> SearchGrid:
    """The grid of a fleet search, checked (one line each) before anything runs."""
    grid = SearchGrid(base=spec, slos=slos, gpus=tuple(axes["gpu"]), tps=tuple(axes["tp"]),
                      block_sizes=tuple(axes["block_size"]), max_num_seqs=tuple(axes["max_num_seqs"]),
                      target_rate=target, clients=clients, tolerance=tolerance, max_rate=max_rate, plain=plain,
                      replicas=fleet, max_replicas=max_replicas)
    check_fleet(grid)
    return grid


def _what(axes: dict, fleet: tuple | str | None) -> str:
    """'12 configurations' (or fleets) a search is about to try."""
    total = len(axes["gpu"]) * len(axes["tp"]) * len(axes["block_size"]) * len(axes["max_num_seqs"])
    if isinstance(fleet, tuple):
        total *= len(fleet)
    what = "configurations" if fleet is None else "fleets" if fleet != "auto" else \
        "configurations, each with its fewest replicas,"
    return f"{total} {what}"


@deployment_options
@pdo.pool_options
def search(
    deployments: DeploymentChoices,
    slo: list[str] = SLOS,
    workload: str = opt.WORKLOAD, trace: Optional[Path] = opt.TRACE, param: Optional[list[str]] = opt.PARAM,
    rate: str = typer.Option("max", "--rate", help="target requests/s, or 'max' for the most capacity per dollar"),
    burstiness: float = opt.BURSTINESS, concurrency: Optional[int] = TARGET_CLIENTS,
    duration: Optional[float] = typer.Option(600.0, help="seconds of arrivals in each simulated probe"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help="requests per probe instead of "
                                                                           "--duration"),
    seed: int = opt.SEED, profile: Optional[Path] = opt.PROFILE, cost_model: Optional[str] = opt.COST_MODEL,
    price: list[str] = typer.Option([], "--price", help="GPU=DOLLARS per GPU-hour, overriding "
                                                       "planner/data/prices.json; repeatable"),
    tolerance: float = typer.Option(0.05, help="stop each capacity search when its bracket is this close"),
    slo_attainment: Optional[float] = opt.SLO_ATTAINMENT,
    max_rate: float = typer.Option(256.0, help="highest rate tried (per replica in a fleet search)"),
    replicas: Optional[str] = REPLICAS, router: Optional[str] = ROUTER, max_replicas: int = MAX_REPLICAS_OPTION,
    pd: Optional[str] = PD, pools: Optional[dict] = None,
    plain: bool = PLAIN, executor: str = EXECUTOR, workers: Optional[int] = WORKERS,
    ray_address: Optional[str] = RAY_ADDRESS, out: Optional[Path] = opt.OUT, as_json: bool = opt.AS_JSON,
) -> None:
    """Cheapest configuration (--gpu x --tp x --block-size x --max-num-seqs, comma lists) that serves --rate
    within the SLOs; every other deployment setting applies to all of them."""
    err = Console(stderr=True)
    try:
        if trace is not None and not trace.is_file():
            raise PlannerError(f"--trace {trace}: no such file")
        axes = {name: deployments.values(name) or default for name, default in AXES.items()}
        base = deployments.without(*AXES, *LAYOUT_AXES).one("search", model="opt-13b")
        _refuse_run_wide(base, cost_model, profile, duration, max_replicas, pd)
        parse_price_overrides(price)               # (each refused before the search says it starts)
        check_executor(executor)
        load = load_of(workload, trace, param, requests, None if requests is not None else duration, seed,
                       burstiness)
        spec = RunSpec(deployment=base, load=load, cost_model=cost_model, profile=str(profile) if profile else None,
                       slo_attainment=slo_attainment)
        if concurrency is not None and rate is not None and rate.strip().lower() != "max":
            raise PlannerError(f"give --rate or --concurrency, not both: a concurrency's clients send each request "
                               f"when their previous one ends (--rate {rate})")
        if concurrency is not None and concurrency < 1:
            raise PlannerError(f"--concurrency must be >= 1 client, got {concurrency}")
        if concurrency is not None:
            load.check_closed_loop()              # before the search says it starts
        if workers is not None and workers < 1:
            raise PlannerError(f"--workers must be >= 1, got {workers}")
        target = None if concurrency is not None else _rate(rate)
        slos = parse_slos([",".join(slo)])          # a bad SLO fails before the search starts
        folder = run_folder(out, "search", load.workload)
        if pd is not None:
            spec = _one_layout(deployments, spec, "a P/D search (--pd)", axes)
            return _search_pd(spec.with_fleet(router="round-robin" if router is None else router), pools, pd, axes,
                              slo, target, replicas, concurrency, price, folder, err, max_replicas, as_json)
        pdo.refuse_without_pd(pools)
        spec, fleet = _fleet_of(spec, replicas, router)
        spec, layouts = _layouts(deployments, spec, axes, fleet)
        grid = None if fleet is None else _fleet_grid(
            spec, axes, slos, target if concurrency is None else concurrency,
            clients=concurrency is not None, tolerance=tolerance, max_rate=max_rate, plain=plain, fleet=fleet,
            max_replicas=max_replicas)
        progress = _announce(err, folder, axes, fleet, base.model, load.workload, executor, concurrency, len(layouts))
        run = dict(executor=executor, workers=workers, ray_address=ray_address,
                   prices=parse_price_overrides(price), on_done=progress)
        if grid is None:                # one deployment per configuration, as before fleets
            result = search_layouts(functools.partial(
                api.search, slos=",".join(slo), gpus=axes["gpu"], tps=axes["tp"], block_sizes=axes["block_size"],
                max_num_seqs=axes["max_num_seqs"], rate=target, clients=concurrency, tolerance=tolerance,
                max_rate=max_rate, plain=plain, **run), spec, layouts)
        else:
            result = api.run_grid(grid, run.pop("executor"), **run)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(exc) from None
    _write(result, folder, err)
    if as_json:
        typer.echo(json.dumps(result.document()))
    else:
        _print_summary(result)
    refused = every_refused(result.configs)
    if refused is not None:         # nothing ran: the settings admit no configuration, said as a refusal
        count = len(result.configs)
        which = "the one tried was" if count == 1 else f"all {count} were"
        raise fail(PlannerError(f"no configuration could run: {which} refused ({fleet_label(refused)}: "
                                f"{refused['note']})"))


def _refuse_run_wide(base, cost_model: str | None, profile: Path | None, duration: float | None,
                     max_replicas: int, pd: str | None) -> None:
    """What applies to every configuration, refused in one line before the search starts (not reported as
    each configuration's failure, with the search exiting as if it had run)."""
    if cost_model is not None:
        if cost_model.strip().lower().startswith("linear:"):
            parse_linear(cost_model.strip().lower())
        else:
            parse_cost_model(cost_model)
    if profile is not None and not profile.is_file():
        raise PlannerError(f"--profile {profile}: no such file")
    if duration is not None and not 0 < duration < math.inf:
        raise PlannerError(f"--duration must be a finite number of seconds > 0, got {duration}")
    if max_replicas < 1:
        raise PlannerError(f"--max-replicas must be >= 1, got {max_replicas}")
    if pd is not None and not pd.strip():
        raise PlannerError("--pd: give P:D (prefill and decode replicas, e.g. 1:2) or auto")
    node_link(base.node_link)


def _layouts(deployments: DeploymentChoices, spec: RunSpec, axes: dict, fleet) -> tuple[RunSpec, list]:
    """The (dp, expert parallel) layouts searched: --dp's values and, for a MoE, EP on and off unless
    --enable-expert-parallel says which (planner/sizing/layouts.py); a fleet search keeps one, in its spec."""
    base = spec.deployment
    if fleet is not None:
        spec = _one_layout(deployments, spec, "a fleet search (--replicas)")
        return spec, [(spec.deployment.dp, spec.deployment.enable_expert_parallel)]
    dps = deployments.values("dp") or (base.dp,)
    eps = deployments.values("enable_expert_parallel") or (False, True)
    return spec, layouts_for(base.model, tuple(dps), tuple(axes["tp"]), tuple(eps))


def _one_layout(deployments: DeploymentChoices, spec: RunSpec, search: str, axes: dict | None = None) -> RunSpec:
    """The spec with the one --dp and --enable-expert-parallel `search` takes (the base deployment leaves
    them out, as the layout search sets them); with `axes` (a P/D search, whose grid is GPU x TP), the one
    --block-size and --max-num-seqs too."""
    one = {"dp": deployments.values("dp") or (spec.deployment.dp,),
           "enable_expert_parallel": deployments.values("enable_expert_parallel")
           or (spec.deployment.enable_expert_parallel,)}
    if axes is not None:
        one.update(block_size=axes["block_size"], max_num_seqs=axes["max_num_seqs"])
    many = [name for name, values in one.items() if len(values) > 1]
    if many:
        raise PlannerError(f"{', '.join('--' + n.replace('_', '-') for n in many)}: one value in {search}")
    return spec.with_deployment(**{name: values[0] for name, values in one.items()})


def _announce(err: Console, folder: Path, axes: dict, fleet, model: str, workload: str, executor: str,
              concurrency, layouts: int = 1) -> SearchProgress:
    """The line a search starts with, and its progress (each configuration's row as it finishes)."""
    layout = f" in {layouts} dp/EP layouts" if layouts > 1 else ""
    err.print(f"searching {_what(axes, fleet)}{layout} of {model} on {workload} ({executor} executor); "
              f"each one's row goes to {folder}/configs.csv as it finishes", highlight=False)
    return SearchProgress(err, folder, "clients" if concurrency is not None else "req/s", fleet=fleet is not None)


def _search_pd(spec: RunSpec, pools: dict, ratios: str, axes: dict, slo: list[str], target, replicas, concurrency,
               price: list[str], folder: Path, err: Console, max_replicas: int, as_json: bool) -> None:
    """search --pd: P:D ratios against aggregated serving (planner/cli/pd_search.py)."""
    pd_search.check(spec, target, replicas, concurrency)
    ratios = pd_search.parse_ratios(ratios)
    slos = parse_slos([",".join(slo)])
    err.print(f"searching P/D ratios against aggregated serving for {spec.deployment.model} at {target:g} req/s "
              f"({len(axes['gpu']) * len(axes['tp'])} configurations, one at a time)", highlight=False)
    doc = pd_search.run_pd_search(spec, pools, ratios, axes, slos, target, parse_price_overrides(price), folder, err,
                                  max_replicas)
    err.print(f"wrote {folder}/pd_search.json, configs.csv ({doc['wall_time']:.1f} s)", highlight=False)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    pd_search.print_pd_search(doc)


class SearchProgress:
    """Each configuration as it finishes: a line with the count done and an ETA on stderr, and its row
    appended to configs.partial.csv, so an interrupted search keeps what it found (the run folder is
    made with the first row: a search refused before anything ran leaves none)."""

    def __init__(self, err: Console, folder: Path, unit: str = "req/s", fleet: bool = False) -> None:
        self.err, self.folder, self.unit, self.started = err, folder, unit, time.perf_counter()
        self.columns = FLEET_PARTIAL_COLUMNS if fleet else PARTIAL_COLUMNS
        self.partial = folder / "configs.partial.csv"
        self.rows = 0

    def __call__(self, row: dict, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done * (total - done)
        if "missed_at_replicas" in row:              # --replicas auto
            what = (f"{row['replicas']} replicas meet the SLOs" if row["replicas"] is not None else row["note"])
        else:
            what = f"{row['capacity']:.3g} {self.unit}" if row["capacity"] is not None else row["note"]
        self.err.print(f"  [{done}/{total}, {elapsed:.0f} s, ETA {eta:.0f} s] {fleet_label(row)}, block "
                       f"{row['block_size']}, max seqs {row['max_num_seqs']}: {what}", highlight=False)
        if not self.rows:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.partial.write_text(",".join(self.columns) + "\n")
        self.rows += 1
        with self.partial.open("a") as f:
            f.write(",".join("" if row.get(k) is None else str(row[k]).replace(",", ";") for k in self.columns)
                    + "\n")


PARTIAL_COLUMNS = ("gpu", "tp", "block_size", "max_num_seqs", "capacity", "first_miss", "bounded", "probes", "note")
FLEET_PARTIAL_COLUMNS = PARTIAL_COLUMNS[:4] + ("replicas", "missed_at_replicas") + PARTIAL_COLUMNS[4:]


def _write(result, folder: Path, err: Console) -> None:
    for gpu, cost in result.prices.items():
        if not cost.verified:
            err.print(f"note: the price of {gpu} (${cost.usd_per_gpu_hour:g}/GPU-hour) is unverified: no public "
                      f"source was found for it; give your own with --price {gpu}=DOLLARS_PER_GPU_HOUR",
                      highlight=False)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "configs.csv").write_text(result.csv_text())
    (folder / "search.json").write_text(json.dumps(result.document(), indent=2))
    (folder / "configs.partial.csv").unlink(missing_ok=True)
    plot_pareto(result, folder / "pareto.png")
    err.print(f"wrote {folder}/configs.csv, pareto.png, search.json ({result.wall_time:.1f} s)", highlight=False)


def _parallel(row: dict) -> str:
    """'2', '2 x pp2' with pipeline stages, or '2 x dp2 EP' for a MoE layout's row."""
    dp = f" x dp{row['dp']}" if row.get("dp", 1) > 1 else ""
    return f"{row['tp']}{layout_suffix(row.get('pp'))}{dp}{' EP' if row.get('enable_expert_parallel') else ''}"


def _print_summary(result) -> None:
    if result.grid.auto:
        return _print_fewest(result)
    console = Console() if Console().is_terminal else Console(width=160)
    unit = "clients" if result.grid.clients else "req/s"
    fleet = result.grid.fleet
    table = Table(title="configurations (Pareto front first, then by cost)" if not fleet else
                  f"fleets, {result.grid.router} router "
                  f"(Pareto front first, then by cost)")
    for col in ("gpu", "tp", *(("replicas",) if fleet else ()), "block", "max seqs", f"capacity {unit}", "$/hour",
                f"{unit} per $/h", "note"):
        table.add_column(col)
    rows = sorted(result.configs, key=lambda r: (not r["pareto"], r["capacity"] is None, r["cost_per_hour"],
                                                 -(r["capacity"] or 0)))
    for r in rows:
        table.add_row(r["gpu"], _parallel(r), *((str(r["replicas"]),) if fleet else ()), str(r["block_size"]),
                      str(r["max_num_seqs"]),
                      "-" if r["capacity"] is None else f"{r['capacity']:.3g}", f"{r['cost_per_hour']:.2f}",
                      "-" if r["capacity_per_dollar"] is None else f"{r['capacity_per_dollar']:.3g}",
                      ("Pareto " if r["pareto"] else "") + r["note"])
    console.print(table)
    target = result.grid.target_rate
    b = result.best
    if b is None:
        if every_refused(result.configs) is None:     # (else none ran, which the refusal after says)
            console.print(f"No configuration reaches {target:g} {unit} within the SLOs." if target is not None
                          else "No configuration meets the SLOs at any load tried.")
        return
    why = f"cheapest reaching {target:g} {unit}" if target is not None else "most capacity per dollar"
    console.print(f"Best ({why}): {fleet_label(b)}, block size {b['block_size']}, max_num_seqs "
                  f"{b['max_num_seqs']}: {b['capacity']:.3g} {unit} at ${b['cost_per_hour']:.2f}/hour.",
                  highlight=False)
    if result.speculation is not None:
        for line in speculation_lines(result.speculation, b["capacity"]):
            console.print(line, highlight=False)


def _print_fewest(result) -> None:
    """--replicas auto: each configuration's fewest replicas at the target rate, cheapest first."""
    console = Console() if Console().is_terminal else Console(width=160)
    g = result.grid
    table = Table(title=f"fewest replicas for {g.target_rate:g} req/s, "
                        f"{g.router} router (cheapest first)")
    for col in ("gpu", "tp", "replicas", "misses at", "block", "max seqs", "$/hour", "SLO use", *g.slos, "note"):
        table.add_column(col)
    rows = sorted(result.configs, key=lambda r: (r["replicas"] is None, r["cost_per_hour"] or 0.0,
                                                 r["slo_use"] or 0.0))
    for r in rows:
        def show(v, fmt="{:.3g}"):
            return "-" if v is None else fmt.format(v)
        table.add_row(r["gpu"], str(r["tp"]), show(r["replicas"], "{}"), show(r["missed_at_replicas"], "{}"),
                      str(r["block_size"]), str(r["max_num_seqs"]), show(r["cost_per_hour"], "{:.2f}"),
                      show(r["slo_use"]), *(show(r.get(name)) for name in g.slos),
                      ("Pareto " if r["pareto"] else "") + r["note"])
    console.print(table)
    b = result.best
    if b is None:
        if every_refused(result.configs) is None:
            console.print(f"No configuration serves {g.target_rate:g} req/s within the SLOs with up to "
                          f"{g.max_replicas} replicas.")
        return
    below = (f"; {b['missed_at_replicas']} miss them" if b["missed_at_replicas"] else "")
    console.print(f"Best (cheapest fleet serving {g.target_rate:g} req/s): {fleet_label(b)}, block size "
                  f"{b['block_size']}, max_num_seqs {b['max_num_seqs']} at ${b['cost_per_hour']:.2f}/hour "
                  f"(SLO use {b['slo_use']:.3g}{below}).", highlight=False)
