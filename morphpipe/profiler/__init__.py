"""morphpipe.profiler: hardware facts and phase timings -> Profile (versioned JSON); the Profiler measures them."""
from morphpipe.profiler.contention import Contention, ContentionMonitor
from morphpipe.profiler.hardware import GpuFacts, HardwareFacts
from morphpipe.profiler.profile import SCHEMA_VERSION, PhaseTiming, Profile, ThreadScaling

__all__ = ["Contention", "ContentionMonitor", "GpuFacts", "HardwareFacts", "PhaseTiming", "Profile", "Profiler",
           "SCHEMA_VERSION", "ThreadScaling"]


def __getattr__(name: str) -> object:
    """`Profiler` is imported on first use: it times the training step, whose modules read Profiles from here."""
    if name == "Profiler":
        from morphpipe.profiler.profiler import Profiler

        return Profiler
    raise AttributeError(f"module 'morphpipe.profiler' has no attribute {name!r}")
