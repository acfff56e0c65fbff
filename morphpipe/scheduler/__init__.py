"""morphpipe.scheduler: SimPy model of dual-buffer scheduling -> predicted epoch, feedback; Plan (JSON)."""
from morphpipe.scheduler.durations import Durations
from morphpipe.scheduler.plan import PLAN_SCHEMA_VERSION, SCHEDULE_KINDS, Plan
from morphpipe.scheduler.planning import Convergence, converge, plan_from_profile
from morphpipe.scheduler.result import BlockRecord, SimulationResult, TraceRecord
from morphpipe.scheduler.scheduler import ENGINES, Scheduler
from morphpipe.scheduler.simulate_plan import draw_plan, simulate_plan

__all__ = [
    "BlockRecord", "Convergence", "Durations", "ENGINES", "PLAN_SCHEMA_VERSION", "Plan", "SCHEDULE_KINDS",
    "Scheduler", "SimulationResult", "TraceRecord", "converge", "draw_plan", "plan_from_profile",
    "simulate_plan",
]
