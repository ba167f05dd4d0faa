# The Kubernetes operator (kopf) alone: `autorl controller`. No torch, no agent runner: it only talks
# to the Kubernetes API and the grader.
#   make images   (or: podman build -f docker/controller.Dockerfile -t autorl/controller:0.1.0 .)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install -q 'setuptools>=68,<81' wheel
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services/controller/pyproject.toml services/controller/
RUN pip install --no-build-isolation . ./services/controller
COPY autorl ./autorl
COPY services/controller ./services/controller
RUN pip install --no-build-isolation --no-deps --force-reinstall . ./services/controller \
 && pip uninstall -y -q pip setuptools wheel

FROM ${BASE_IMAGE}
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin autorl
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/tmp/autorl HOME=/tmp
USER 10001
EXPOSE 8080
CMD ["autorl", "controller"]
