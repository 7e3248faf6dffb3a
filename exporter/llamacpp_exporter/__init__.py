"""llamacpp-exporter: a Prometheus exporter for llama.cpp's llama-server."""

import importlib.util

__version__ = "0.1.0"


def log_reading() -> str:
    """Whether the install compiled the log reading (setup.py), found without importing it."""
    spec = importlib.util.find_spec("llamacpp_exporter.pipeline")
    origin = (spec.origin or "") if spec is not None else ""
    return "compiled" if origin.endswith((".so", ".pyd")) else "pure Python"
