"""Who we are in a distributed run: rank, world size and rendezvous address, from whichever launcher started us.

- torchrun (and `morphpipe train --nproc N`) set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  MASTER_ADDR and MASTER_PORT;
- Open MPI's mpirun sets OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE; the address
  is MASTER_ADDR / MASTER_PORT when exported (`mpirun -x`), else rank 0 picks its host and a free
  port and broadcasts them over MPI itself (mpi4py, the `morphpipe[mpi]` extra).
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE")
OMPI_VARIABLES = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the run and where rank 0 listens for the rendezvous."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str

    @property
    def init_method(self) -> str:
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (chosen by the OS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _integer(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None:
        if default is None:
            raise ValueError(f"{name} is not set; start the run with torchrun, mpirun or `morphpipe train --nproc N`")
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer; the launcher's environment is broken") from None


def _check(rank: int, world: int, local_rank: int, local_world: int, names: tuple[str, str, str, str]) -> None:
    if world < 1:
        raise ValueError(f"{names[1]}={world} must be >= 1")
    if not 0 <= rank < world:
        raise ValueError(f"{names[0]}={rank} must lie in [0, {names[1]}={world})")
    if not 1 <= local_world <= world:
        raise ValueError(f"{names[3]}={local_world} must lie in [1, {names[1]}={world}]")
    if not 0 <= local_rank < local_world:
        raise ValueError(f"{names[2]}={local_rank} must lie in [0, {names[3]}={local_world})")


def _address(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """MASTER_ADDR and MASTER_PORT when both are set (an error when only one is)."""
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if addr is None and port is None:
        return None
    if addr is None or port is None:
        missing = "MASTER_ADDR" if addr is None else "MASTER_PORT"
        raise ValueError(f"{missing} is not set while {'MASTER_PORT' if addr is None else 'MASTER_ADDR'} is; "
                         "export both (rank 0's host and a free port) or neither")
    number = _integer(environ, "MASTER_PORT")
    if not 0 < number < 65536:
        raise ValueError(f"MASTER_PORT={port!r} must be a TCP port in 1..65535")
    return addr, number


def _mpi_address(rank: int) -> tuple[str, int]:
    """Rank 0's host and a free port, broadcast over MPI (mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError("started by mpirun without MASTER_ADDR/MASTER_PORT, and mpi4py is not installed to share "
                         "rank 0's address; `pip install morphpipe[mpi]`, or `mpirun -x MASTER_ADDR=<rank 0 host> "
                         "-x MASTER_PORT=<free port>`") from None
    mine = None
    if rank == 0:
        host = socket.gethostname()
        try:
            addr = socket.gethostbyname(host)
        except OSError:
            addr = "127.0.0.1"
        mine = (addr, free_port("0.0.0.0"))
    return MPI.COMM_WORLD.bcast(mine, root=0)


def detect(environ: Mapping[str, str] | None = None) -> DistEnv | None:
    """The run this process belongs to, or None when no launcher started it (a single process)."""
    environ = os.environ if environ is None else environ
    if all(name in environ for name in TORCHRUN_VARIABLES):
        rank, world = _integer(environ, "RANK"), _integer(environ, "WORLD_SIZE")
        local_rank = _integer(environ, "LOCAL_RANK", rank)
        local_world = _integer(environ, "LOCAL_WORLD_SIZE", world)
        _check(rank, world, local_rank, local_world, ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
        address = _address(environ)
        if address is None:
            raise ValueError("RANK and WORLD_SIZE are set but MASTER_ADDR and MASTER_PORT are not; launch with "
                             "torchrun or `morphpipe train --nproc N`, which set them")
        return DistEnv(rank, world, local_rank, local_world, *address, launcher="torchrun")
    if any(name in environ for name in TORCHRUN_VARIABLES):
        missing = [name for name in TORCHRUN_VARIABLES if name not in environ]
        raise ValueError(f"{', '.join(missing)} is not set while the other torchrun variables are; launch with "
                         "torchrun or `morphpipe train --nproc N`")
    if all(name in environ for name in OMPI_VARIABLES):
        rank, world = _integer(environ, "OMPI_COMM_WORLD_RANK"), _integer(environ, "OMPI_COMM_WORLD_SIZE")
        local_rank = _integer(environ, "OMPI_COMM_WORLD_LOCAL_RANK", rank)
        local_world = _integer(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", world)
        _check(rank, world, local_rank, local_world, ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                                      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))
        address = _address(environ) or _mpi_address(rank)
        return DistEnv(rank, world, local_rank, local_world, *address, launcher="mpirun")
    return None
