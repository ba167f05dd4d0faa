# The evaluator worker, in two variants of this one file (VARIANT build argument). Both hold
# OpenCompass's environment, /opt/venv, where the worker runs too: the CPU side of
# docker/evaluator-worker.lock (docker/lock_cpu_side.py: its pins and hashes without the CUDA packages
# OpenCompass's requirements pull in) plus the CPU build of torch 2.13.0, on Python 3.11.
# .venv-opencompass holds the same versions (make setup installs it under these pins).
#   gpu  adds /opt/vllm, the resident engine's environment: docker/evaluator-vllm.lock, the vLLM 0.25.0,
#        torch 2.11.0 (CUDA 13.0) and transformers 5.17.0 that ran on an H200, installed as they ran
#        there (without dependencies, every file hash-checked). AUTORL_VLLM_PYTHON names its Python, so
#        the opencompass backend generates with vLLM there while OpenCompass, in /opt/venv, renders
#        every prompt and scores every answer. The chart's image (tag 0.1.0; `make images`, GPU=1 by
#        default), built where CUDA wheels can be fetched, on the same base as every other image.
#   cpu  nothing more: OpenCompass with HuggingFace models on the CPU (tag 0.1.0-cpu,
#        `make images GPU=0`, what the tests run).
# Our own packages go in without dependencies, so nothing but the locks decides a third-party
# version; they are built as wheels in a stage of their own and installed over a copy of the locked
# environment, so a change to the code rebuilds a layer of a few megabytes, not one that holds torch.
# docs/EVALUATION.md explains why two environments.
ARG BASE_IMAGE=python:3.11-slim
ARG VARIANT=gpu

FROM ${BASE_IMAGE} AS dependencies
WORKDIR /src
COPY docker/evaluator-worker.lock docker/lock_cpu_side.py ./
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install -q 'setuptools>=68,<81' wheel
ENV PATH=/opt/venv/bin:$PATH
# The lock carries hashes, so pip checks every download against it. The second pip run adds torch's own
# dependencies, every locked package kept at its pin.
RUN python3 lock_cpu_side.py evaluator-worker.lock > cpu.lock \
 && python3 lock_cpu_side.py --constraints evaluator-worker.lock > cpu-constraints.txt \
 && pip install --no-deps --require-hashes -r cpu.lock \
 && pip install -c cpu-constraints.txt ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      torch==2.13.0 -r cpu-constraints.txt \
 && python3 -c "import torch; assert torch.version.cuda is None, torch.version.cuda" \
 && pip check

FROM dependencies AS wheels
COPY pyproject.toml README.md ./
COPY autorl ./autorl
COPY services/evaluator-worker ./services/evaluator-worker
RUN pip wheel -q --no-deps --no-build-isolation -w /wheels . ./services/evaluator-worker

# The gpu variant's engine environment. Without dependencies, as it ran: the lock departs from vLLM's
# own pins where the run did (docker/evaluator-vllm.in says where), so pip's resolver would refuse it.
FROM ${BASE_IMAGE} AS engine
COPY docker/evaluator-vllm.lock /src/
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/vllm \
 && /opt/vllm/bin/pip install -q --no-deps --require-hashes --only-binary :all: -r /src/evaluator-vllm.lock \
 && VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 /opt/vllm/bin/python -c "from vllm import LLM, SamplingParams"

FROM ${BASE_IMAGE} AS runtime
ARG VARIANT
RUN case "$VARIANT" in cpu|gpu) ;; *) echo "VARIANT must be cpu or gpu, not '$VARIANT'" >&2; exit 1;; esac \
 && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin autorl \
 && mkdir -p /var/lib/autorl && chown 10001:10001 /var/lib/autorl
COPY --from=dependencies /opt/venv /opt/venv
COPY --from=wheels /wheels /tmp/wheels
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/var/lib/autorl \
    AUTORL_OPENCOMPASS_BIN=/opt/venv/bin/opencompass AUTORL_EVAL_BACKEND=opencompass \
    HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
RUN pip install -q --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels \
 && opencompass --help >/dev/null \
 && python -c "import autorl_evaluator.backends.opencompass.backend"

FROM runtime AS runtime-cpu

FROM runtime AS runtime-gpu
# Triton (inside vLLM) compiles a small C launcher for its kernels at run time.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY --from=engine /opt/vllm /opt/vllm
# flashinfer is not in the engine's environment (it was not where vLLM 0.25 ran): vLLM's sampler must
# not ask for it.
ENV AUTORL_VLLM_PYTHON=/opt/vllm/bin/python VLLM_USE_FLASHINFER_SAMPLER=0
# The engine server is the worker's own file, run by the engine's Python: it starts there.
RUN "$AUTORL_VLLM_PYTHON" -c "import vllm" \
 && "$AUTORL_VLLM_PYTHON" "$(python -c 'from autorl_evaluator.backends.opencompass.resident_engine import SERVER; print(SERVER)')" \
      --help >/dev/null

FROM runtime-${VARIANT}
USER 10001
# Prometheus metrics, where AUTORL_WORKER_METRICS_PORT (the chart's evaluator.metricsPort) asks for them.
EXPOSE 9100
CMD ["autorl", "worker"]
