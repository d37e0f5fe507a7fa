"""The networks and their losses: transformer, image models, chunked cross-entropy, standardization loss, GPT-2 I/O.

A module here imports nothing of accellib outside models/ except the config leaf (core/options.py).
"""
