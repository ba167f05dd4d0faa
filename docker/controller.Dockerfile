# The Kubernetes operator (kopf). No torch: it only talks to the Kubernetes API and the grader.
#   docker build -f docker/controller.Dockerfile -t ghcr.io/autorl/controller:0.1.0 .
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY autorl ./autorl
COPY services/controller ./services/controller
RUN pip install . ./services/controller

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin autorl
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/tmp/autorl HOME=/tmp
USER 10001
EXPOSE 8080
CMD ["autorl", "controller"]
