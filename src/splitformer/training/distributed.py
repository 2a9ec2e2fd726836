"""Data-parallel training: the process group, ranks, and what the fit loop reduces across them.

    torchrun --nproc_per_node 2 -m splitformer train ...

torchrun starts one process per rank and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``. When ``WORLD_SIZE`` > 1, ``session()`` initialises the
default process group from that environment (``init_method="env://"``): the NCCL backend with
one GPU per local rank (``cuda:LOCAL_RANK``) when CUDA is present, gloo on the CPU otherwise.
Without ``WORLD_SIZE`` (or with 1) nothing is initialised and every function below answers for a
single process (rank 0 of 1), so single-process training is untouched.

What ``training.loop.fit`` does with the group (docs/training.md):

* the global batch is ``batch_size``: every rank draws the same global batches (seeded by
  (seed, epoch)) and takes its contiguous shard (``shard_bounds``: sizes differ by at most one);
* rank r backpropagates its mean objective weighted by ``world * n_r / n`` (``loss_weight``);
  DistributedDataParallel averages the gradients over the ranks, so the update is the gradient
  of the mean objective over the global batch, the single-process gradient, also when the last
  batch does not split evenly (a rank whose shard is empty runs one example with weight 0);
* logged values are ``sum_r (n_r / n) * value_r`` (``all_reduce_sum``), the global batch's;
* only rank 0 (``is_main``) prints, logs and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "Ranks",
    "all_reduce_sum",
    "all_reduce_sum_",
    "barrier",
    "broadcast_",
    "broadcast_object",
    "cleanup",
    "env_world_size",
    "init",
    "is_initialized",
    "is_main",
    "local_rank",
    "loss_weight",
    "rank",
    "rank0_error",
    "same_on_every_rank",
    "session",
    "shard",
    "shard_bounds",
    "world_size",
    "wrap",
]

TIMEOUT = datetime.timedelta(minutes=30)


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (torchrun's), 1 when it is not set."""
    text = os.environ.get("WORLD_SIZE", "").strip()
    if not text:
        return 1
    try:
        value = int(text)
    except ValueError:
        raise RuntimeError(f"WORLD_SIZE must be an integer, got {text!r}") from None
    if value < 1:
        raise RuntimeError(f"WORLD_SIZE must be >= 1, got {value}")
    return value


def is_initialized() -> bool:
    """Whether a default process group is up."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (``RANK`` before the group is up, 0 for a single process)."""
    if is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def world_size() -> int:
    """The number of ranks in the group (1 for a single process)."""
    return dist.get_world_size() if is_initialized() else 1


def local_rank() -> int:
    """The rank on this machine (``LOCAL_RANK``; 0 for a single process)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def is_main() -> bool:
    """Rank 0: the process that prints, logs and writes checkpoints."""
    return rank() == 0


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def device() -> torch.device:
    """Where this rank computes: ``cuda:LOCAL_RANK`` under NCCL, else the CPU."""
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def init() -> bool:
    """Initialise the default process group from torchrun's environment when ``WORLD_SIZE`` >
    1 and none is up yet; returns whether this call initialised it (then ``cleanup`` ends it).
    """
    if is_initialized() or env_world_size() <= 1:
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch has no torch.distributed")
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={env_world_size()} but {', '.join(missing)} not set: "
                           "launch with torchrun (torchrun --nproc_per_node N -m splitformer "
                           "train ...)")
    backend = _backend()
    if backend == "nccl":
        if local_rank() >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank()} but only "
                               f"{torch.cuda.device_count()} CUDA devices are visible (one GPU "
                               "per process)")
        torch.cuda.set_device(local_rank())
        dist.init_process_group("nccl", init_method="env://", timeout=TIMEOUT,
                                device_id=torch.device("cuda", local_rank()))
    else:
        dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)
    return True


def cleanup() -> None:
    """End the default process group (if one is up), after every rank got here and the
    wrapped model is gone: otherwise a rank could abort at exit ("terminate called without an
    active exception", seen with gloo in about one run in five)."""
    if is_initialized():
        # DistributedDataParallel's reducer sits in reference cycles: collect it now, while the
        # interpreter is whole, not during finalisation (where gloo's threads then abort)
        gc.collect()
        barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def session() -> Iterator[Ranks]:
    """``init()`` on entry; on exit ``cleanup()`` if this session initialised the group (a
    group the caller set up is left to the caller). Yields this process's ``Ranks``."""
    started = init()
    try:
        yield Ranks.current()
    finally:
        if started:
            cleanup()


def barrier() -> None:
    """Wait for every rank (nothing for a single process)."""
    if is_initialized():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[local_rank()])
        else:
            dist.barrier()


def all_reduce_sum(values: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """The sum over ranks of ``values`` (a float64 CPU tensor; the values themselves for a
    single process)."""
    t = torch.as_tensor(values, dtype=torch.float64).detach().reshape(-1)
    if not is_initialized() or dist.get_world_size() == 1:
        return t.cpu()
    t = t.to(device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu()


def broadcast_object(obj, src: int = 0):
    """``obj`` of rank ``src`` on every rank (a small picklable value: a path, a flag)."""
    if not is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_sum_(tensors: Sequence[torch.Tensor], bucket: int = 2**24) -> None:
    """Sum ``tensors`` over the ranks in place (gradients averaged by hand: sum, then divide):
    packed into flat buffers of at most ``bucket`` elements of one dtype, one all-reduce each,
    on this rank's device. Every rank passes tensors of the same shapes and dtypes in the same
    order. Nothing for a single process."""
    if not is_initialized() or dist.get_world_size() == 1:
        return
    dev = device()

    def reduce(group: list[torch.Tensor]) -> None:
        flat = torch.cat([t.detach().reshape(-1).to(dev) for t in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for t in group:
            t.detach().copy_(flat[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()

    group: list[torch.Tensor] = []
    for t in tensors:
        if group and (t.dtype != group[0].dtype
                      or sum(g.numel() for g in group) + t.numel() > bucket):
            reduce(group)
            group = []
        group.append(t)
    if group:
        reduce(group)


def broadcast_(tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` in place with rank ``src``'s (parameters after a phase that only
    rank ``src`` ran). Nothing for a single process."""
    if not is_initialized() or dist.get_world_size() == 1:
        return
    dev = device()
    for t in tensors:
        buf = t.detach().to(dev).contiguous()
        dist.broadcast(buf, src=src)
        if buf.data_ptr() != t.data_ptr():
            t.detach().copy_(buf)


def rank0_error(error: Exception | None, types: Sequence[type[Exception]] = ()
                ) -> Exception | None:
    """The error rank 0 met (None: none), on every rank, rebuilt on the others as the same
    class where it is a ValueError, an OSError or one of ``types`` (RuntimeError else): a
    phase that only rank 0 runs (taking a folder's lock, reading its run) tells the others, who
    would otherwise wait at the next collective forever. ``error`` itself for one process."""
    if not is_initialized() or dist.get_world_size() == 1:
        return error
    text = broadcast_object(None if error is None else [type(error).__name__, str(error)])
    if text is None or error is not None:
        return error
    known = {e.__name__: e for e in (ValueError, OSError, *types)}
    return known.get(text[0], RuntimeError)(text[1])


def same_on_every_rank(values, what: str) -> None:
    """ValueError on every rank (saying ``what`` should hold) when a rank's ``values`` (a small
    picklable value: fingerprints, names) differ from rank 0's. Nothing for one process."""
    if not is_initialized() or dist.get_world_size() == 1:
        return
    differ = int(all_reduce_sum([float(broadcast_object(values) != values)])[0])
    if differ:
        raise ValueError(f"{what}: {differ} rank(s) differ from rank 0")


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous slice [start, stop) of ``n`` examples that ``rank`` of ``world`` takes:
    ranks in order, shard sizes differ by at most one, the larger shards first (so rank 0, whose
    buffers DistributedDataParallel broadcasts, always has examples; when n < world the last
    ranks' shards are empty)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world size {world}")
    q, m = divmod(n, world)
    start = rank * q + min(rank, m)
    return start, start + q + (1 if rank < m else 0)


def shard(batch: tuple[torch.Tensor, ...], rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """This rank's contiguous shard of every tensor of a global batch (first dimension)."""
    start, stop = shard_bounds(len(batch[0]), rank, world)
    return tuple(t[start:stop] for t in batch)


def loss_weight(n_local: int, n_global: int, world: int) -> float:
    """What a rank's mean objective is multiplied by before ``backward`` so that the gradients
    averaged by DistributedDataParallel (sum / world) are the global batch's mean gradient:
    ``world * n_local / n_global`` (1 when the batch splits evenly)."""
    return world * n_local / n_global


def wrap(module: nn.Module) -> nn.Module:
    """``module`` in DistributedDataParallel (on this rank's device), or ``module`` itself for a
    single process."""
    if not is_initialized() or dist.get_world_size() == 1:
        return module
    # a parameter whose gradient comes out strided (the class token's, [1, 1, d]) is copied into
    # its bucket: correct, and too small to matter
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    dev = device()
    if dev.type == "cuda":
        return nn.parallel.DistributedDataParallel(module, device_ids=[dev.index],
                                                   output_device=dev.index)
    return nn.parallel.DistributedDataParallel(module)


@dataclass(frozen=True)
class Ranks:
    """This process in the group: ``rank`` of ``world``, its ``device``."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @classmethod
    def current(cls) -> Ranks:
        return cls(rank(), world_size(), device())
