"""morphpipe.profiler: hardware facts and phase timings -> Profile (versioned JSON)."""
from morphpipe.profiler.hardware import GpuFacts, HardwareFacts
from morphpipe.profiler.profile import SCHEMA_VERSION, PhaseTiming, Profile, ThreadScaling

__all__ = ["GpuFacts", "HardwareFacts", "PhaseTiming", "Profile", "SCHEMA_VERSION", "ThreadScaling"]
