# The agent runner, the built-in agents and the agents' Python (requirements-agent.txt: what
# .venv-agent holds locally). Also runs the prepare Jobs.
# In a cluster its pods run as other ids (the platform's for the cache, each experiment's own for its
# workspace and agent: docs/KUBERNETES.md); 1000 is for running the image by hand.
#   make images        the CPU build of torch (TORCH_INDEX_URL: PyTorch's CPU index), tag 0.1.0-cpu
#   make images GPU=1  PyPI's torch, which carries its CUDA runtime (TORCH_INDEX_URL empty), tag 0.1.0
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install -q 'setuptools>=68,<81' wheel
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The training stack is pinned (constraints.txt): an agent's results must not change with a release.
COPY constraints.txt requirements-agent.txt ./
RUN pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -c constraints.txt -r requirements-agent.txt
COPY pyproject.toml README.md ./
COPY services/agent-runner/pyproject.toml services/agent-runner/
COPY services/agents/pyproject.toml services/agents/
RUN pip install --no-build-isolation -c constraints.txt . ./services/agent-runner ./services/agents
COPY autorl ./autorl
COPY services/agent-runner ./services/agent-runner
COPY services/agents ./services/agents
RUN pip install --no-build-isolation --no-deps --force-reinstall . ./services/agent-runner ./services/agents \
 && pip check \
 && python -c "import torch, trl, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

FROM ${BASE_IMAGE}
RUN useradd --uid 1000 --user-group --create-home --shell /bin/bash agent
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/tmp/autorl HF_HUB_DISABLE_TELEMETRY=1
USER 1000
WORKDIR /workspace
CMD ["autorl", "agent-runner", "--help"]
