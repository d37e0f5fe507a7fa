"""The one training loop and what it runs on: config, trainer, tasks, launch, run folders, records, schedules, hardware.

A module here may import models/, data/, analysis/ (FLOPs), techniques/ and parallel/ (the hook points the loop
calls), never drivers/ or the command lines at the package root.
"""
