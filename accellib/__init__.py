"""accellib: readable implementations of techniques that make transformer training faster,
driven by one HuggingFace Accelerate training loop."""
__version__ = "0.1.0"
