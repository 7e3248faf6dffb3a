# llamacpp-exporter: non-root, read-only friendly, one process.
# The wheel is built where a C compiler is (its hot path compiled by mypyc, setup.py) and
# installed in the slim image, which has none.
FROM python:3.12-bookworm AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY exporter ./exporter
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

FROM python:3.12-slim-bookworm
COPY --from=build /wheels /wheels
# with the otlp extra: --traces.otlp-endpoint sends each request's trace
RUN pip install --no-cache-dir "$(echo /wheels/*.whl)[otlp]" && rm -rf /wheels \
    && mkdir -p /data && chown 65534:65534 /data   # a new named volume on /data takes this owner
WORKDIR /
USER 65534:65534
EXPOSE 10938
ENTRYPOINT ["llamacpp-exporter"]
CMD ["--llama.url", "http://llama-server:8080", "--llama.log-path", "/logs/llama-server.log"]
