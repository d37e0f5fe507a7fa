"""Numbers and figures about runs: FLOPs, the statistics rule, the planner, the scale trend, the results cache, plotting.

Pure functions of configs and records; a module here never builds a Trainer.
"""
