"""The networks and their losses: the transformer, the image models, the chunked cross-entropy, the standardization loss, GPT-2 conversion.

A module here imports nothing of accellib outside models/ except the config leaf (core/options.py).
"""
