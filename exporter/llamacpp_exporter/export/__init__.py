"""What leaves the exporter: the Prometheus families (``metrics``), the conversation costs and
their API (``conversations``), the events file (``events``), the HTTP server (``http``) and its TLS and
basic-auth file (``web_config``)."""
