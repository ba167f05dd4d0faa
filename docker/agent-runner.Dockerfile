# The agent runner and the built-in agents (TRL on CUDA). Also runs the prepare Jobs.
# In a cluster its pods run as other ids (the platform's for the cache, each experiment's own for its
# workspace and agent: docs/KUBERNETES.md); 1000 is for running the image by hand.
#   docker build -f docker/agent-runner.Dockerfile -t ghcr.io/autorl/agent-runner:0.1.0 .
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY autorl ./autorl
COPY services/agent-runner ./services/agent-runner
# The training stack is pinned: an agent's results must not change with an upstream release.
# PyPI's Linux torch wheels carry their CUDA runtime; the node's driver comes from the container runtime.
RUN pip install torch==2.13.0 transformers==5.24.0 trl==1.16.0 \
 && pip install '.[ml]' './services/agent-runner[agents]' \
 && python -c "import trl, transformers; assert (trl.__version__, transformers.__version__) == ('1.16.0', '5.24.0')"

FROM python:3.11-slim
RUN useradd --uid 1000 --user-group --create-home --shell /bin/bash agent
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/tmp/autorl HF_HUB_DISABLE_TELEMETRY=1
USER 1000
WORKDIR /workspace
CMD ["autorl", "agent-runner", "--help"]
