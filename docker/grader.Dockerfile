# The grading API (FastAPI). No torch: it validates and fingerprints checkpoints, it never runs them.
#   make images   (or: podman build -f docker/grader.Dockerfile -t autorl/grader:0.1.0 .)
# BASE_IMAGE: any Debian-based image with python3 and its venv module (`make images` builds one with
# debootstrap where no registry is reachable).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install -q 'setuptools>=68,<81' wheel
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, from the package metadata alone: a source change keeps this layer.
COPY pyproject.toml README.md ./
COPY services/grader/pyproject.toml services/grader/
RUN pip install --no-build-isolation . ./services/grader
COPY autorl ./autorl
COPY services/grader ./services/grader
RUN pip install --no-build-isolation --no-deps --force-reinstall . ./services/grader \
 && pip uninstall -y -q pip setuptools wheel

FROM ${BASE_IMAGE}
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin autorl
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/tmp/autorl HOME=/tmp
USER 10001
EXPOSE 8000 8001
CMD ["autorl", "grader", "--host", "0.0.0.0", "--port", "8000", "--admin-port", "8001"]
