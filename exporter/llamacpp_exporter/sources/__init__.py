"""Where the input comes from: llama-server's log, one module per kind of source (``file``:
followed across rotations; ``command``: a command's output; ``stream``: stdin), behind
``lines.LogSource``, and llama-server's own endpoints (``/health``, ``/slots``,
``/metrics``, ``/lora-adapters``, ``/models``: ``llama_server``)."""
