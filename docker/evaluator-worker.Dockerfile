# The evaluator worker, in two variants of this one file (VARIANT build argument):
#   gpu  OpenCompass 0.5.2 + vLLM 0.13.0 + transformers 4.57 in ONE environment, every package pinned
#        with hashes by docker/evaluator-worker.lock (resolved from docker/evaluator-worker.in for
#        Python 3.11). The chart's image (tag 0.1.0); built where CUDA wheels can be fetched
#        (`make images`, GPU=1 by default), on the same base as every other image.
#   cpu  the lock's OpenCompass side (docker/lock_cpu_side.py: the same pins and hashes, without vLLM
#        and the CUDA packages) plus the CPU build of torch 2.13.0, on Python 3.11: OpenCompass with
#        HuggingFace models on CPU (tag 0.1.0-cpu, `make images GPU=0`, what the tests run). .venv-opencompass holds the
#        same versions (make setup installs it under these pins).
# Our own packages go in without dependencies, so nothing but the lock decides a third-party
# version. docs/EVALUATION.md explains why this vLLM line (not a separate `vllm serve`).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
ARG VARIANT=gpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN case "$VARIANT" in cpu|gpu) ;; *) echo "VARIANT must be cpu or gpu, not '$VARIANT'" >&2; exit 1;; esac \
 && if [ "$VARIANT" = gpu ]; then apt-get update \
      && apt-get install -y --no-install-recommends build-essential && rm -rf /var/lib/apt/lists/*; fi \
 && python3 -m venv /opt/venv && /opt/venv/bin/pip install -q 'setuptools>=68,<81' wheel
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY docker/evaluator-worker.lock docker/lock_cpu_side.py ./
# The lock carries hashes, so pip checks every download against it. The cpu variant's second pip run
# adds torch's own dependencies, every locked package kept at its pin.
RUN if [ "$VARIANT" = gpu ]; then pip install --require-hashes -r evaluator-worker.lock; \
    else python3 lock_cpu_side.py evaluator-worker.lock > cpu.lock \
      && python3 lock_cpu_side.py --constraints evaluator-worker.lock > cpu-constraints.txt \
      && pip install --no-deps --require-hashes -r cpu.lock \
      && pip install -c cpu-constraints.txt ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
           torch==2.13.0 -r cpu-constraints.txt \
      && python3 -c "import torch; assert torch.version.cuda is None, torch.version.cuda" \
      && pip check; fi
COPY pyproject.toml README.md ./
COPY autorl ./autorl
COPY services/evaluator-worker ./services/evaluator-worker
RUN pip install --no-build-isolation --no-deps . ./services/evaluator-worker \
 && opencompass --help >/dev/null \
 && python -c "import autorl_evaluator.backends.opencompass.backend"

FROM ${BASE_IMAGE}
ARG VARIANT=gpu
# Triton (inside vLLM) compiles a small C launcher for its kernels at run time.
RUN if [ "$VARIANT" = gpu ]; then apt-get update \
      && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*; fi \
 && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin autorl \
 && mkdir -p /var/lib/autorl && chown 10001:10001 /var/lib/autorl
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/var/lib/autorl \
    AUTORL_OPENCOMPASS_BIN=/opt/venv/bin/opencompass AUTORL_EVAL_BACKEND=opencompass \
    HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
USER 10001
# Prometheus metrics, where AUTORL_WORKER_METRICS_PORT (the chart's evaluator.metricsPort) asks for them.
EXPOSE 9100
CMD ["autorl", "worker"]
