"""make_accelerator(): one place that builds the Accelerator the same way everywhere.

- CPU is first-class: `cpu=True` when CUDA is absent. Without it, `accelerate launch --multi_gpu`,
  `torchrun` and `notebook_launcher` on a CPU machine silently start N *independent* world-size-1
  runs (accelerate 1.15, state.py only picks MULTI_CPU/gloo when cpu is true).
- A mis-launch fails loudly: the process count must equal WORLD_SIZE, and the one-process
  `accelerate launch --cpu --num_processes N` is caught.
- Techniques add the DDP kwargs they need (e.g. find_unused_parameters for layer dropping).
- bf16 autocast when a bf16-capable GPU is present; fp32 on CPU.
- FSDP2 when the launch asks for it (ACCELERATE_USE_FSDP from an FSDP `accelerate config`): the launch, not the
  training config, decides, so one config runs data-parallel or sharded (fsdp_plugin; tests/test_fsdp.py).

Launch commands that really give N synchronised processes:
    CPU:   ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
               --mixed_precision no --dynamo_backend no -m accellib.train ...
           torchrun --nproc_per_node 2 -m accellib.train ...
    GPUs:  accelerate launch --multi_gpu --num_processes 8 -m accellib.train ...
    FSDP2: accelerate launch --config_file configs/accelerate/fsdp_8gpu.yaml -m accellib.train ...
           accelerate launch --config_file configs/accelerate/fsdp_2proc_cpu.yaml -m accellib.train ...  (2 CPU processes)
"""
from __future__ import annotations

import os

import torch

CPU_LAUNCH = ("ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N --num_machines 1 "
              "--mixed_precision no --dynamo_backend no -m accellib.train ...  (or torchrun --nproc_per_node N -m accellib.train ...)")


class LaunchError(RuntimeError):
    """The processes were not started the way the run needs; the message has the right command."""


def tell_elastic_launcher(line: str) -> None:
    """Give torchrun (and `accelerate launch --multi_gpu`, which runs it) our one-line error as this process's error
    file (TORCHELASTIC_ERROR_FILE, the file torch's @record writes): its failure report, which follows our line, then
    names the error itself where it would say "To enable traceback see: ...". Nothing outside torchrun."""
    import json
    import time
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:  # the launcher's folder is gone: our line is on stderr anyway
        pass


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


def use_cpu(device: str = "auto") -> bool:
    """train.device -> run on the CPU? "cuda" without CUDA is refused: a GPU-scale config that
    silently fell back to the CPU would look hung for days."""
    if device == "cuda" and not torch.cuda.is_available():
        raise LaunchError("train.device=cuda but torch sees no CUDA GPU here (check `nvidia-smi` and "
                          "`python -c 'import torch; print(torch.cuda.is_available())'`); to run this "
                          "config on the CPU anyway, add --train.device=cpu")
    return device == "cpu" or not torch.cuda.is_available()


def process_state(device: str = "auto"):
    """Initialise the process group the way make_accelerator will (CPU mode without CUDA: a bare
    PartialState() would fix a 1-process state on a CPU before the first Accelerator sees gloo).
    Lets a command decide things on the main process before any Accelerator exists."""
    from accelerate.state import PartialState
    ps = PartialState(cpu=use_cpu(device))
    check_world_size(ps.num_processes)
    cpu_barrier(ps)
    return ps


def cpu_barrier(state) -> None:
    """CPU processes on a machine with GPUs. Accelerate's `wait_for_everyone` (accelerate 1.15, state.py) passes
    device_ids=[local rank] to torch.distributed.barrier for every distributed type, MULTI_CPU included; where
    CUDA is visible, torch then runs the gloo barrier on cuda:<local rank>, which fails ("invalid device ordinal")
    on a machine with fewer GPUs than processes (found running notebooks 00 and 05, 2 CPU processes, on a one-GPU
    H200). A gloo group of CPU processes needs no device: every PartialState (they share one state dict) gets a
    barrier without device ids. Nothing changes on GPU runs or where CUDA is absent."""
    if state.distributed_type.value == "MULTI_CPU" and torch.cuda.is_available():
        import torch.distributed as dist
        from accelerate.state import PartialState
        PartialState().__dict__["wait_for_everyone"] = lambda: dist.barrier()


def tracker_available(name: str) -> bool:
    """Is the package of Accelerate's tracker `name` (tensorboard, trackio, wandb) installed?"""
    from accelerate import utils
    return bool(getattr(utils, f"is_{name}_available")())


def tracking_kwargs(trackers: list[str], run_dir) -> dict:
    """The Accelerator arguments that send a run's logs to `trackers` (log.trackers); {} for none.
    Event files of the trackers that write locally (TensorBoard) go to <run_dir>/tensorboard/<project>/.
    A tracker whose package is missing is refused here: Accelerate would only warn and train untracked."""
    if not trackers:
        return {}
    from pathlib import Path

    from accelerate.utils import ProjectConfiguration

    from .options import ConfigError
    for name in trackers:
        if not tracker_available(name):
            raise ConfigError(f"log.trackers={name} needs the {name} package: pip install {name} "
                              f"(or drop {name} from log.trackers)")
    return dict(log_with=list(trackers), project_config=ProjectConfiguration(
        project_dir=str(run_dir), logging_dir=str(Path(run_dir) / "tensorboard")))


def check_dynamo(env=None) -> None:
    """Refuse a whole-model torch.compile asked for by the launcher: `accelerate launch --dynamo_backend X`
    (or an `accelerate config` default with dynamo on) sets ACCELERATE_DYNAMO_BACKEND, and Accelerate's
    prepare() then compiles the whole model, whose program changes with every new plan of a technique
    (PLD's skipped blocks): one recompile per pattern until torch's limit turns it back to eager
    (tests/test_efficiency.py). train.compile=blocks is the compile accellib runs and gpu_check measures."""
    backend = (os.environ if env is None else env).get("ACCELERATE_DYNAMO_BACKEND", "no")
    if backend.strip().lower() not in ("", "no"):
        raise LaunchError(f"the launcher asks for a whole-model compile (ACCELERATE_DYNAMO_BACKEND={backend}, from "
                          "`accelerate launch --dynamo_backend` or `accelerate config`), which recompiles for every "
                          "new technique plan; launch with --dynamo_backend no and set train.compile=blocks "
                          "(the full-scale configs do) to compile each block and the head+loss")


FSDP_CONFIGS = "configs/accelerate/fsdp_2proc_cpu.yaml (2 CPU processes) or configs/accelerate/fsdp_8gpu.yaml"


def _env_true(env, key: str, default: str = "false") -> bool:
    return env.get(key, default).strip().lower() in ("1", "true", "yes")


def fsdp_requested(env=None) -> bool:
    """Does the launch ask for FSDP? `accelerate launch` with an FSDP config (distributed_type: FSDP) or with
    --use_fsdp sets ACCELERATE_USE_FSDP=true and its fsdp_config as FSDP_* variables in every process."""
    return _env_true(os.environ if env is None else env, "ACCELERATE_USE_FSDP")


def fsdp_plugin(env=None):
    """The FullyShardedDataParallelPlugin of an FSDP launch: FSDP2 (torch's fully_shard), one FSDP unit per
    transformer Block (the embeddings, final LayerNorm and tied head form the root unit), no FSDP parameter
    casting (MixedPrecisionPolicy() keeps fp32 all-gathers and fp32 gradient reduce-scatters; a bf16 run
    computes under accelerator.autocast() as the DDP path does, so the residual stream and the embeddings stay
    fp32). The state-dict type (SHARDED_STATE_DICT: torch.distributed.checkpoint, one file per process;
    FULL_STATE_DICT: one file gathered on the main process) and reshard_after_forward come from the launch.
    What was not built or tested is refused in one line."""
    env = os.environ if env is None else env
    version = env.get("FSDP_VERSION", "1").strip()
    if version != "2":
        raise LaunchError(f"FSDP version {version} (FSDP_VERSION, fsdp_config.fsdp_version): accellib runs FSDP2 "
                          f"only; set fsdp_version: 2 (see {FSDP_CONFIGS})")
    policy = env.get("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP").strip().upper()
    cls = env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "Block").strip()
    if policy != "TRANSFORMER_BASED_WRAP" or cls != "Block":
        raise LaunchError(f"fsdp_auto_wrap_policy={policy} with fsdp_transformer_layer_cls_to_wrap={cls}: accellib "
                          "shards one FSDP unit per transformer block; set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP "
                          f"and fsdp_transformer_layer_cls_to_wrap: Block (see {FSDP_CONFIGS})")
    for key, what in (("FSDP_ACTIVATION_CHECKPOINTING", "fsdp_activation_checkpointing"),
                      ("FSDP_OFFLOAD_PARAMS", "fsdp_offload_params"),
                      ("FSDP_CPU_RAM_EFFICIENT_LOADING", "fsdp_cpu_ram_efficient_loading")):
        if _env_true(env, key):
            raise LaunchError(f"{what}: true is not supported by accellib's FSDP path (not built or tested); set it "
                              f"to false (see {FSDP_CONFIGS})")
    sdt = env.get("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT").strip().upper()
    if sdt not in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        raise LaunchError(f"fsdp_state_dict_type={sdt}: FSDP2 checkpoints are SHARDED_STATE_DICT or FULL_STATE_DICT")
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy
    return FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                          transformer_cls_names_to_wrap=["Block"], state_dict_type=sdt,
                                          mixed_precision_policy=MixedPrecisionPolicy())


def distributed_setup(acc, engine=None) -> dict:
    """How a run is split over its processes: {"type": "single process" | "DDP" | "FSDP2 SHARDED_STATE_DICT" |
    "FSDP2 FULL_STATE_DICT" | "<engine> engine", "world_size": N, "backend": Accelerate's distributed type}."""
    if getattr(acc, "is_fsdp2", False):
        kind = f"FSDP2 {acc.state.fsdp_plugin.state_dict_type.name}"
    elif engine is not None:
        kind = f"{engine.name} engine"
    elif acc.num_processes > 1:
        kind = "DDP"
    else:
        kind = "single process"
    return dict(type=kind, world_size=acc.num_processes, backend=acc.distributed_type.value)


def _fsdp_on_cpu(acc, plugin) -> None:
    """Accelerate 1.15 builds FSDP only for accelerators (state.py: the plugin is kept for MULTI_GPU and the like),
    so on CPU processes (gloo) it would silently train DDP. Torch's fully_shard runs on gloo, and Accelerate's
    FSDP2 code (prepare, clip_grad_norm_, save_state/load_state) is device-agnostic: set the distributed type
    in both shared states exactly as Accelerate sets it on GPUs, before anything is prepared."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def _release_single_process_state(cpu: bool, mixed_precision: str) -> None:
    """Let one process build a second trainer with another precision or device (a notebook's CPU runs, then its
    GPU cell): Accelerate keeps the first Accelerator's state for the whole process and refuses a different
    mixed_precision. Without a process group nothing else holds that state, so it is dropped and built again;
    under a launch (WORLD_SIZE set) it is never touched."""
    from accelerate.state import AcceleratorState, PartialState
    if "WORLD_SIZE" in os.environ or not AcceleratorState._shared_state:
        return
    state = AcceleratorState()
    if state.distributed_type.value != "NO":
        return
    if str(state.mixed_precision) != mixed_precision or (state.device.type == "cpu") != cpu:
        AcceleratorState._reset_state(reset_partial_state=True)
        PartialState._reset_state()


def make_accelerator(ddp_kwargs: dict | None = None, precision: str = "auto", device: str = "auto",
                     **kwargs):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    cpu = use_cpu(device)
    check_dynamo()
    plugin = fsdp_plugin() if fsdp_requested() else None
    if plugin is not None and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        raise LaunchError("an FSDP launch with one process shards nothing; start 2 or more processes "
                          f"(accelerate launch --config_file {FSDP_CONFIGS.split(' ')[0]} -m accellib.train ...)")
    handlers = [DistributedDataParallelKwargs(**ddp_kwargs)] if ddp_kwargs and plugin is None else []
    _release_single_process_state(cpu, mixed_precision_for(precision))
    # dynamo "no" explicitly: the compile is train.compile's (accellib.core.trainer.compile_blocks), never prepare()'s
    acc = Accelerator(cpu=cpu, mixed_precision=mixed_precision_for(precision), dynamo_backend="no",
                      kwargs_handlers=handlers, fsdp_plugin=plugin, **kwargs)
    check_world_size(acc.num_processes)
    cpu_barrier(acc.state)
    if plugin is not None:
        if cpu and acc.distributed_type.value == "MULTI_CPU":
            _fsdp_on_cpu(acc, plugin)
        if not acc.is_fsdp2:
            raise LaunchError(f"the launch asks for FSDP but Accelerate set up {acc.distributed_type.value}; "
                              f"launch with accelerate launch --config_file {FSDP_CONFIGS}")
    return acc


def _child(rank: int, fn, args: tuple, world: int, port: int) -> None:
    # OMP_NUM_THREADS says what set_num_threads(1) below does: without it Accelerate warns once per process
    # ("OMP_NUM_THREADS/MKL_NUM_THREADS unset") and resets the thread count to cores / processes
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), ACCELERATE_USE_CPU="true",
                      OMP_NUM_THREADS="1")
    torch.set_num_threads(1)  # first: a forked child of a multi-threaded parent can hang in OpenMP
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(reset_partial_state=True)  # never inherit the parent's 1-process state
    fn(*args)


def _free_port(lo: int = 20000, hi: int = 32000) -> int:
    """A free TCP port for the group's rendezvous, drawn below Linux's ephemeral range (32768-60999). A port
    from bind(("", 0)) is an ephemeral one: between its release and the store's bind, any outgoing connection
    (gloo opens many, and so do concurrent tests) may take it, and the group then fails to form."""
    import random
    import socket
    for port in random.Random().sample(range(lo, hi), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise LaunchError(f"no free TCP port in {lo}-{hi} for the process group")


def launch_processes(fn, args: tuple = (), num_processes: int = 2, timeout_s: float = 300,
                     start_method: str = "fork") -> None:
    """Run fn(*args) on `num_processes` local CPU processes that form one gloo group, from a
    notebook or a test. Like accelerate's debug_launcher, plus a time limit: a process still
    running after `timeout_s` is killed and a LaunchError raised, so a cell or a CI job never
    hangs. A failing child re-raises its error here. "fork" lets notebook-defined functions run;
    use "spawn" for functions importable from a module when the parent holds threads or locks."""
    import time

    import torch.multiprocessing as mp
    port = _free_port()
    ctx = mp.start_processes(_child, args=(fn, args, num_processes, port), nprocs=num_processes,
                             join=False, start_method=start_method)
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise LaunchError(f"{num_processes} processes did not finish within {timeout_s:.0f} s and were "
                              "killed; rerun with a larger timeout_s or a smaller run")
