# llamacpp-exporter: non-root, read-only friendly, one process.
FROM python:3.12-slim-bookworm
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip install --no-cache-dir . && rm -rf /src \
    && mkdir -p /data && chown 65534:65534 /data   # a new named volume on /data takes this owner
WORKDIR /
USER 65534:65534
EXPOSE 10938
ENTRYPOINT ["llamacpp-exporter"]
CMD ["--llama.url", "http://llama-server:8080", "--llama.log-path", "/logs/llama-server.log"]
