"""Starting and ending one rank: the process group, this rank's cores, and failing fast.

A rank that raises prints its error (with its rank) and leaves at once with `os._exit`, without
waiting on collective teardown: its sockets close, so the other ranks' next collective fails
within moments, they print their own error and leave the same way. The process group's timeout
bounds the wait of a rank whose peer hangs without dying.
"""
from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from morphpipe.distributed.affinity import apply_cores, rank_cores, whoami
from morphpipe.distributed.env import DistEnv

DEFAULT_TIMEOUT_S = 300.0


def start_rank(env: DistEnv, *, cuda: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[int]:
    """Joins the process group (NCCL with CUDA, else gloo), takes this rank's share of its node's cores."""
    if not timeout_s > 0:
        raise ValueError(f"--dist-timeout must be > 0 seconds, got {timeout_s!r}")
    if cuda:
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo", init_method=env.init_method, rank=env.rank,
                            world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    peers: list = [None] * env.world_size
    dist.all_gather_object(peers, whoami())
    cores = rank_cores(peers, env.rank)
    apply_cores(cores)
    return cores


def run_rank(main: Callable[[], int], env: DistEnv, program: str = "morphpipe train") -> NoReturn:
    """Runs `main` as rank `env.rank` and ends the process with its status; on an error prints it with the rank and
    exits with status 1."""
    try:
        status = main()
    except BaseException as error:  # noqa: BLE001 - any failure must stop this rank and, through it, the others
        detail = "".join(traceback.format_exception(error))
        print(f"{program}: rank {env.rank} of {env.world_size} failed: {error!r}\n{detail}", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        os._exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()
    finish_rank(status)


def finish_rank(status: int) -> NoReturn:
    """Ends a finished rank at once, skipping interpreter finalization: a daemon thread still inside a native
    call (one that released the GIL) is ended there by pthread_exit, which aborts the whole process ("terminate
    called without an active exception") after its work is done and reported: seen under load on 2 gloo ranks."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
