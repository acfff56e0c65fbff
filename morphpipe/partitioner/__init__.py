"""morphpipe.partitioner: the CPU:GPU batch split (exact bounds, then feedback fine-tuning)."""
from morphpipe.partitioner.bounds import Eq6Optimum, LowerBound, best_eq6, best_lower_bound, eq6, lower_bound
from morphpipe.partitioner.cores import CoreSplit, even_core_split, split_cores
from morphpipe.partitioner.feedback import Feedback
from morphpipe.partitioner.partitioner import Partitioner, Split, buffer_sizes, pinned_buffer_limit
from morphpipe.partitioner.times import PhaseTimes

__all__ = [
    "CoreSplit", "Eq6Optimum", "Feedback", "LowerBound", "Partitioner", "PhaseTimes", "Split",
    "best_eq6", "best_lower_bound", "buffer_sizes", "eq6", "even_core_split", "lower_bound", "pinned_buffer_limit",
    "split_cores",
]
