"""Workloads: the traces the engine and the planner share.

    from workloads import make_trace, Trace
    trace = make_trace("sharegpt", num_requests=1000, rate=2.0, seed=0)
    trace.save("sharegpt.jsonl"); Trace.load("sharegpt.jsonl").stats()
"""

from .arrivals import PROCESSES, RAMP_UP_STRATEGIES, RampUp, arrival_times, burstiness_arrival
from .conversations import import_conversations
from .errors import TraceError
from .importers import import_burstgpt, import_csv_trace, import_custom, import_sharegpt, import_sonnet
from .make import WORKLOADS, make_trace, parse_workload_params, workload_params
from .mooncake import MOONCAKE_BLOCK, import_mooncake
from .schema import TraceRequest
from .trace import Trace

__all__ = [
    "MOONCAKE_BLOCK",
    "PROCESSES",
    "WORKLOADS",
    "Trace",
    "TraceError",
    "TraceRequest",
    "RAMP_UP_STRATEGIES",
    "RampUp",
    "arrival_times",
    "burstiness_arrival",
    "import_conversations",
    "import_csv_trace",
    "import_burstgpt",
    "import_custom",
    "import_mooncake",
    "import_sharegpt",
    "import_sonnet",
    "make_trace",
    "parse_workload_params",
    "workload_params",
]
