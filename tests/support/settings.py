"""One deployment's settings as tests use them: the grader and its workers read the same
environment (as the chart gives both the same connection and evaluation variables), so a test
builds one object that serves as either service's settings."""

from __future__ import annotations

from autorl_evaluator.settings import WorkerSettings
from autorl_grader.settings import GraderSettings


class DeploymentSettings(GraderSettings, WorkerSettings):
    """The grader's settings and the worker's, read from one environment."""
