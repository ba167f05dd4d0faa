"""The admin action that has a closed experiment's agent files and final checked on a cluster
(autorl_grader.provenance; admin token, beside the admin API's other experiment actions)."""

from __future__ import annotations

from fastapi import APIRouter

from autorl.api.answers import ExperimentAnswer
from autorl.store import experiments
from autorl_grader.api.deps import AdminDep, StateDep
from autorl_grader.api.refusals import refusals
from autorl_grader.provenance import begin_provenance
from autorl_grader.views import experiment_view

router = APIRouter(
    prefix="/v1/experiments", tags=["admin"], dependencies=[AdminDep], responses=refusals(401, 503)
)


@router.post("/{name}/provenance/check", response_model=ExperimentAnswer, responses=refusals(404, 409))
def check_provenance(name: str, state: StateDep) -> ExperimentAnswer:
    """Once the experiment is finished (its agent can no longer react): copy the agent's text files
    of ``code/`` and ``output/`` and the final's files out of the workspace, and queue an
    evaluator's check of them (the test questions they hold, the final on the twin split). Safe to
    ask again; ``test_overlap`` is set once the check is recorded. 409 while the experiment runs."""
    begin_provenance(state, name)
    with state.db.session() as session:
        view = experiment_view(session, experiments.get_experiment(session, name))
    state.forget_experiment(name)
    return view
