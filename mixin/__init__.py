"""The monitoring mixin of llamacpp-exporter: the PromQL blocks (``queries``), the rules
(``rules``), the dashboards (``dashboards``) and the Kubernetes objects (``kubernetes``), all
from one thresholds file (``thresholds.yaml``). One generator writes them all:

    .venv/bin/python -m mixin          # writes alerts/, dashboards/ and deploy/kubernetes/ files
    .venv/bin/python -m mixin --check  # exit 1 if a committed file is stale
"""
