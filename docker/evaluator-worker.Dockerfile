# The GPU evaluator worker: OpenCompass 0.5.2 + vLLM 0.13.0 + transformers 4.57 in ONE environment,
# pinned (with hashes) by docker/evaluator-worker.lock, resolved from docker/evaluator-worker.in.
# Our own packages go in without dependencies, so nothing but the lock decides a third-party
# version. docs/EVALUATION.md explains why this vLLM line (not a separate `vllm serve`).
#   docker build -f docker/evaluator-worker.Dockerfile -t ghcr.io/autorl/evaluator-worker:0.1.0 .
# The image evaluates with the opencompass backend (the chart's default). The hf backend belongs
# to the transformers 5 stack and is not meant to run here.
FROM python:3.12-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY docker/evaluator-worker.lock ./evaluator-worker.lock
# The lock carries hashes, so pip checks every download against it.
RUN pip install --require-hashes -r evaluator-worker.lock
COPY pyproject.toml README.md ./
COPY autorl ./autorl
COPY services/evaluator-worker ./services/evaluator-worker
RUN pip install --no-deps . ./services/evaluator-worker \
 && opencompass --help >/dev/null \
 && python -c "import autorl_evaluator.backends.opencompass"

FROM python:3.12-slim-bookworm
# Triton (inside vLLM) compiles a small C launcher for its kernels at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin autorl
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/var/lib/autorl \
    AUTORL_OPENCOMPASS_BIN=/opt/venv/bin/opencompass AUTORL_EVAL_BACKEND=opencompass \
    HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
RUN mkdir -p /var/lib/autorl && chown 10001:10001 /var/lib/autorl
USER 10001
CMD ["autorl", "worker"]
