"""accellib: readable implementations of techniques that make transformer training faster,
driven by one HuggingFace Accelerate training loop."""
from pathlib import Path

__version__ = "0.1.0"

# The repository checkout this package lives in (editable install): data/, configs/, results/ and
# notebooks/ are found from here, never from the working directory.
REPO_ROOT = Path(__file__).resolve().parents[1]
