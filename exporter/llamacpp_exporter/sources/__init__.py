"""Where the input comes from: llama-server's log (a file followed across rotations, a
command's output, stdin: ``tail``) and llama-server's own endpoints (``/health``, ``/slots``,
``/metrics``, ``/lora-adapters``, ``/models``: ``llama_server``)."""
