"""Techniques that change *how* a step executes across processes (layered gradient
accumulation, modular pipeline parallelism, delayed gradients)."""
