"""make_accelerator(): one place that builds the Accelerator the same way everywhere.

- CPU is first-class: `cpu=True` when CUDA is absent. Without it, `accelerate launch --multi_gpu`,
  `torchrun` and `notebook_launcher` on a CPU machine silently start N *independent* world-size-1
  runs (accelerate 1.15, state.py only picks MULTI_CPU/gloo when cpu is true).
- A mis-launch fails loudly: the process count must equal WORLD_SIZE, and the one-process
  `accelerate launch --cpu --num_processes N` is caught.
- Techniques add the DDP kwargs they need (e.g. find_unused_parameters for layer dropping).
- bf16 autocast when a bf16-capable GPU is present; fp32 on CPU.

Launch commands that really give N synchronised processes:
    CPU:   ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
               --mixed_precision no --dynamo_backend no -m accellib.train ...
           torchrun --nproc_per_node 2 -m accellib.train ...
    GPUs:  accelerate launch --multi_gpu --num_processes 8 -m accellib.train ...
"""
from __future__ import annotations

import os

import torch

CPU_LAUNCH = ("ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N --num_machines 1 "
              "--mixed_precision no --dynamo_backend no -m accellib.train ...  (or torchrun --nproc_per_node N -m accellib.train ...)")


class LaunchError(RuntimeError):
    """The processes were not started the way the run needs; the message has the right command."""


def mixed_precision_for(precision: str) -> str:
    if precision == "bf16":
        return "bf16"
    if precision == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def check_world_size(num_processes: int) -> None:
    env_ws = os.environ.get("WORLD_SIZE")
    if env_ws is None:
        if os.environ.get("MASTER_ADDR") and os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true"):
            raise LaunchError("`accelerate launch --cpu --num_processes N` starts only ONE process "
                              f"without mpirun; launch with: {CPU_LAUNCH}")
        return
    if int(env_ws) != num_processes:
        raise LaunchError(f"launched as {env_ws} processes but Accelerate runs {num_processes} "
                          f"(each process would train alone); launch with: {CPU_LAUNCH}")


def make_accelerator(ddp_kwargs: dict | None = None, precision: str = "auto", cpu: bool | None = None,
                     **kwargs):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    cpu = (not torch.cuda.is_available()) if cpu is None else cpu
    handlers = [DistributedDataParallelKwargs(**ddp_kwargs)] if ddp_kwargs else []
    acc = Accelerator(cpu=cpu, mixed_precision=mixed_precision_for(precision),
                      kwargs_handlers=handlers, **kwargs)
    check_world_size(acc.num_processes)
    return acc
