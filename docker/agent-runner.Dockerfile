# The agent runner (the supervisor, which also runs the prepare Jobs) and, apart from it, the agents'
# Python: requirements-agent.txt, the core and the built-in agents (what .venv-agent holds locally),
# in /opt/agents. The supervisor's own environment, /opt/venv, reads the training stack from there
# (one copy of torch) but the agents' Python holds no supervisor module: AUTORL_AGENT_PYTHON names it.
# In a cluster its pods run as other ids (the platform's for the cache, each experiment's own for its
# workspace and agent: docs/KUBERNETES.md); 1000 is for running the image by hand.
# The dependencies are a stage of their own, copied before the project's code is installed over them:
# a change to the code rebuilds a layer of a few megabytes, not one that holds torch.
#   make images        the CPU build of torch (TORCH_INDEX_URL: PyTorch's CPU index), tag 0.1.0-cpu
#   make images GPU=1  PyPI's torch, which carries its CUDA runtime (TORCH_INDEX_URL empty), tag 0.1.0
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS dependencies
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/agents && /opt/agents/bin/pip install -q 'setuptools>=68,<81' wheel \
 && python3 -m venv /opt/venv && /opt/venv/bin/pip install -q 'setuptools>=68,<81' wheel \
 && /opt/agents/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/autorl-agents.pth"
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The training stack is pinned (constraints.txt): an agent's results must not change with a release.
COPY constraints.txt requirements-agent.txt ./
RUN /opt/agents/bin/pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -c constraints.txt -r requirements-agent.txt
# The packages' own dependencies, from their pyproject.toml alone (the README they name is a stand-in
# here, so an edit to it leaves this stage as it is).
COPY pyproject.toml ./
COPY services/agent-runner/pyproject.toml services/agent-runner/
COPY services/agents/pyproject.toml services/agents/
RUN touch README.md \
 && /opt/agents/bin/pip install --no-build-isolation -c constraints.txt . ./services/agents \
 && pip install --no-build-isolation -c constraints.txt . ./services/agent-runner

FROM dependencies AS wheels
COPY README.md ./
COPY autorl ./autorl
COPY services/agent-runner ./services/agent-runner
COPY services/agents ./services/agents
RUN pip wheel -q --no-deps --no-build-isolation -w /wheels . ./services/agents ./services/agent-runner

FROM ${BASE_IMAGE}
RUN useradd --uid 1000 --user-group --create-home --shell /bin/bash agent
COPY --from=dependencies /opt/agents /opt/agents
COPY --from=dependencies /opt/venv /opt/venv
COPY --from=wheels /wheels /tmp/wheels
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/tmp/autorl HF_HUB_DISABLE_TELEMETRY=1 \
    AUTORL_AGENT_PYTHON=/opt/agents/bin/python
RUN /opt/agents/bin/pip install -q --no-deps --force-reinstall /tmp/wheels/autorl-[0-9]*.whl /tmp/wheels/autorl_agents-*.whl \
 && pip install -q --no-deps --force-reinstall /tmp/wheels/autorl-[0-9]*.whl /tmp/wheels/autorl_agent_runner-*.whl \
 && rm -rf /tmp/wheels \
 && /opt/agents/bin/pip check && pip check \
 && /opt/agents/bin/python -c "import torch, trl, transformers, autorl_agents.example_grpo; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
 && ! /opt/agents/bin/python -c "import autorl_agent_runner" 2>/dev/null
USER 1000
WORKDIR /workspace
CMD ["autorl", "agent-runner", "--help"]
