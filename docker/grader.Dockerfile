# The grading API (FastAPI). No torch: it validates and fingerprints checkpoints, it never runs them.
#   docker build -f docker/grader.Dockerfile -t ghcr.io/autorl/grader:0.1.0 .
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY autorl ./autorl
COPY services/grader ./services/grader
RUN pip install . ./services/grader

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin autorl
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 AUTORL_HOME=/tmp/autorl HOME=/tmp
USER 10001
EXPOSE 8000
CMD ["autorl", "grader", "--host", "0.0.0.0", "--port", "8000"]
