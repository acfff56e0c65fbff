"""morphpipe.profiler: hardware facts and phase timings -> Profile (versioned JSON); the Profiler measures them."""
from morphpipe.profiler.contention import Contention, ContentionMonitor
from morphpipe.profiler.hardware import GpuFacts, HardwareFacts
from morphpipe.profiler.profile import SCHEMA_VERSION, PhaseTiming, Profile, ThreadScaling
from morphpipe.profiler.profiler import Profiler

__all__ = ["Contention", "ContentionMonitor", "GpuFacts", "HardwareFacts", "PhaseTiming", "Profile", "Profiler",
           "SCHEMA_VERSION", "ThreadScaling"]
