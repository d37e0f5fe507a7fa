"""Numbers and figures about runs: FLOPs, the statistics rule, planner, scale trend, results cache, plotting.

Pure functions of configs and records; a module here never builds a Trainer.
"""
