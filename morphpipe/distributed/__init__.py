"""Multi-process, multi-node data-parallel training on torch.distributed (DDP), with seeds split by throughput."""
from morphpipe.distributed.cluster import ClusterPrediction, local_profile, predict_cluster, rank_plan
from morphpipe.distributed.env import DistEnv, detect
from morphpipe.distributed.split import SeedSplit, check_exactly_once

__all__ = ["ClusterPrediction", "DistEnv", "SeedSplit", "check_exactly_once", "detect", "local_profile",
           "predict_cluster", "rank_plan"]
