"""Engines: techniques that change *how* a step executes across processes, and their communication.

Layered gradient accumulation (with its ZeRO half), and the engines that split the model across processes:
modular pipeline parallelism, Ouroboros delayed gradients; simulate.py draws pipeline schedules."""
# the technique registry first: it imports every module here, and engine.py must be complete before
# the engines that subclass it (importing accellib.parallel.engine first would otherwise be circular)
from .. import techniques  # noqa: F401
