"""``@kopf.timer``: drive one Experiment a step further on each tick.

Level-triggered on purpose: every tick reads the Experiment, its Jobs and the grader's view afresh
and acts on what it finds, so a restarted controller (or a missed watch event) simply carries on.
Each step is idempotent: objects are created only if missing, and the grader is asked to register
only when the token Secret does not exist.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from autorl.api.admin_client import ExperimentConflictError, ExperimentNotFoundError, GradingError
from autorl.api.answers import MAX_FINAL_ATTEMPTS, ExperimentAnswer, RegisteredAnswer, TokenAnswer
from autorl.experiment import ExperimentResourceStatus, ExperimentSpec, Phase, status_text
from autorl.protocol.feedback import Feedback
from autorl.provenance.unverified import TEST_UNVERIFIED, bounded, check_made, note
from autorl.wait_reasons import Reason, evaluators_phrase, reason_named
from autorl_controller.operator.context import OperatorContext, context_of
from autorl_controller.operator.handlers.create import describe
from autorl_controller.operator.kube import (
    EVENTS,
    EXPERIMENTS,
    JOBS,
    NETWORK_POLICIES,
    PODS,
    SECRETS,
    SERVICES,
    KubeError,
    Resource,
)
from autorl_controller.operator.lifecycle import (
    JobState,
    Outcome,
    agent_deadline_s,
    agent_finished_since,
    agent_outcome,
    agent_running_since,
    conditions_status,
    evaluators_condition,
    job_status,
    merged,
    outcome_condition,
    outcome_from_conditions,
    provenance_condition,
    provenance_findings,
    status_from_view,
    with_condition,
)
from autorl_controller.operator.manifests import (
    AGENT_CONTAINER,
    ExperimentRef,
    GraderServiceError,
    agent_deadline_slack_s,
    agent_grading_url,
    agent_run_as_id,
    build_agent_job,
    build_network_policy,
    build_prepare_job,
    build_registration,
    build_token_secret,
    id_collisions,
)
from autorl_controller.operator.pod_waits import PodWait, event_wait, job_wait, last_words, pod_wait
from autorl_controller.operator.reporting import as_body, patch_status, transition

log = logging.getLogger("autorl.controller")
#: A resolver that does not answer must not stall the experiment's tick.
DNS_TIMEOUT_S = 5.0
#: Seconds past a pod's grace period before its files are read where its pods cannot be read.
POD_GRACE_SLACK_S = 5
#: Kubernetes answers that no retry will fix: the manifest itself is refused.
_PERMANENT_KUBE_STATUSES = (400, 422)


def is_active(*, status: kopf.Status, **_: Any) -> bool:
    """Timer filter: validated (a phase is set) and not finished yet."""
    phase = status.get("phase")
    return bool(phase) and not Phase(str(phase)).terminal


async def reconcile(*, name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    assert namespace is not None  # Experiments are namespaced
    context = context_of(memo)
    fresh = await context.kube.get(EXPERIMENTS, namespace, name)
    if fresh is None or fresh["metadata"].get("deletionTimestamp"):
        return
    status = dict(fresh.get("status") or {})
    phase = status.get("phase")
    if not phase or Phase(str(phase)).terminal:
        return
    ref = ExperimentRef(name, namespace, fresh["metadata"]["uid"])
    try:
        spec = ExperimentSpec.model_validate(fresh["spec"])
    except ValidationError as exc:
        # Validated at creation; only a changed model (an upgrade) can get here. Say so, once.
        await transition(context, fresh, status, Phase.FAILED, describe(exc), reason=Reason.INVALID_SPEC)
        return
    step = Step(context, fresh, ref, spec, status)
    try:
        await step.run(Phase(str(phase)))
    except GradingError as exc:
        if exc.retryable:
            raise kopf.TemporaryError(str(exc), delay=context.settings.sync_interval_s) from exc
        await step.fail(f"the grader refused the experiment: {exc.detail}", Reason.GRADER_REFUSED)
    except KubeError as exc:
        if exc.status in _PERMANENT_KUBE_STATUSES:
            await step.fail(f"Kubernetes refused an object: {exc}", Reason.KUBERNETES_REFUSED)
        else:
            raise kopf.TemporaryError(str(exc), delay=context.settings.sync_interval_s) from exc


async def resolve_hosts(hosts: list[str]) -> dict[str, list[str]]:
    """Addresses of the egress host names; a name that does not resolve allows nothing (yet)."""
    loop = asyncio.get_running_loop()
    resolved: dict[str, list[str]] = {}
    for host in hosts:
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), timeout=DNS_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            resolved[host] = []
            continue
        resolved[host] = sorted({str(info[4][0]) for info in infos})
    return resolved


class Step:
    """One reconcile tick of one experiment."""

    def __init__(
        self,
        context: OperatorContext,
        body: dict[str, Any],
        ref: ExperimentRef,
        spec: ExperimentSpec,
        status: dict[str, Any],
    ) -> None:
        self.context = context
        self.settings = context.settings
        self.body = body
        self.ref = ref
        self.spec = spec
        self.status = status

    async def run(self, phase: Phase) -> None:
        if phase in (Phase.PENDING, Phase.PREPARING):
            await self.prepare()
        elif phase is Phase.BASELINE:
            await self.baseline()
        elif phase is Phase.RUNNING:
            await self.running()
        elif phase is Phase.FINISHING:
            await self.finishing()

    async def _move(
        self, phase: Phase, message: str, extra: ExperimentResourceStatus | None = None, *, reason: Reason
    ) -> None:
        await transition(self.context, self.body, self.status, phase, message, reason=reason, extra=extra)

    def _owns(self, child: dict[str, Any]) -> bool:
        owners = child.get("metadata", {}).get("ownerReferences") or []
        return any(owner.get("uid") == self.ref.uid for owner in owners)

    async def _child(self, resource: Resource, name: str) -> dict[str, Any] | None:
        """This run's child of that name; one left by an earlier run of the same name is deleted.

        A deleted Experiment's children go with it (its cleanup, the garbage collector), but one may
        still be on its way out when the Experiment is applied again: it is never taken for this run's.
        """
        child = await self.context.kube.get(resource, self.ref.namespace, name)
        if child is None or self._owns(child):
            return child
        await self.context.kube.delete(resource, self.ref.namespace, name)
        return None

    async def _adopt_and_create(self, resource: Resource, manifest: dict[str, Any]) -> bool:
        kopf.adopt(manifest, owner=as_body(self.body))
        existing, created = await self.context.kube.ensure(resource, manifest)
        if not created and not self._owns(existing):
            name = manifest["metadata"]["name"]
            await self.context.kube.delete(resource, self.ref.namespace, name)
            raise kopf.TemporaryError(
                f"waiting for {name}, left by an earlier run of this name, to be deleted",
                delay=self.settings.sync_interval_s,
            )
        return created

    async def fail(self, message: str, reason: Reason) -> None:
        """End Failed; the grader closes the experiment too (best effort: it may never have known it)."""
        try:
            view = await self.context.grader.experiment(self.ref.grader_name)
            if view.status in ("pending", "running"):
                await self.context.grader.finish(self.ref.grader_name, "failed", bounded(message))
        except GradingError:
            pass
        await self._move(Phase.FAILED, message, reason=reason)

    # --- Pending / Preparing: register, keep the token, fill the cache --------------------------------

    async def register(self) -> bool:
        """Register with the grader and keep the agent's token in a Secret; False (and Failed) when
        the registration is invalid (a name too long for the grader)."""
        if await self._child(SECRETS, self.ref.secret_name) is not None:
            return True
        service = await self._grader_service()
        try:
            registration = build_registration(self.ref, self.spec, self.settings)
        except ValidationError as exc:
            reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            await self.fail(f"the grader cannot register the experiment: {reasons}", Reason.GRADER_REFUSED)
            return False
        answer: RegisteredAnswer | TokenAnswer
        try:
            answer = await self.context.grader.register(registration)
        except ExperimentConflictError:
            # Registered by an earlier tick whose Secret was never written: its token is lost.
            answer = await self.context.grader.new_token(self.ref.grader_name)
        try:
            url = agent_grading_url(service, answer.token, self.settings)
        except GraderServiceError as exc:
            raise kopf.TemporaryError(str(exc), delay=self.settings.sync_interval_s) from exc
        secret = build_token_secret(self.ref, token=answer.token, grading_server_url=url)
        await self._adopt_and_create(SECRETS, secret)
        return True

    async def _grader_service(self) -> dict[str, Any]:
        """The grader's Service, whose cluster IP agents reach the grader at (no DNS needed)."""
        where = f"{self.settings.grader_namespace}/{self.settings.grader_service}"
        try:
            service = await self.context.kube.get(
                SERVICES, self.settings.grader_namespace, self.settings.grader_service
            )
        except KubeError as exc:
            raise kopf.TemporaryError(
                f"cannot read the grader's Service {where} (the address agents reach the grader at): {exc}; "
                "the chart's Role grants get on it",
                delay=self.settings.sync_interval_s,
            ) from exc
        if service is None:
            raise kopf.TemporaryError(
                f"waiting for the grader's Service {where} (the address agents reach the grader at); "
                "check grader_service and grader_namespace",
                delay=self.settings.sync_interval_s,
            )
        return service

    async def prepare(self) -> None:
        job = await self._child(JOBS, self.ref.prepare_job_name)
        if job is None and not await self.own_id():
            return
        if not await self.register():
            return
        if job is None:
            await self._adopt_and_create(JOBS, build_prepare_job(self.ref, self.spec, self.settings))
        state = job_status(job)
        if state.state in (JobState.FAILED, JobState.DEADLINE_EXCEEDED):
            # The step's own refusal (a hub id the hub does not know) says more than the Job's verdict.
            pods = await self._pods(job) if job is not None else None
            said = last_words(pods) if pods else None
            detail = f": {said or state.message}" if said or state.message else ""
            await self.fail(
                f"the prepare Job failed ({state.reason}){detail}; "
                f"see kubectl logs job/{self.ref.prepare_job_name} -n {self.ref.namespace}",
                Reason.PREPARE_FAILED,
            )
            return
        if state.state is not JobState.SUCCEEDED:
            wait = await self.pod_wait(job, "prepare") if job is not None else None
            if wait is not None:
                await self._move(Phase.PREPARING, wait.message, reason=wait.reason)
            else:
                await self._move(
                    Phase.PREPARING,
                    f"preparing {self.spec.model} and the {self.spec.task} train split",
                    reason=Reason.PREPARING,
                )
            return
        await self.context.grader.baseline(self.ref.grader_name)
        await self._move(
            Phase.BASELINE, "the base model is queued for evaluation", reason=Reason.WAITING_FOR_EVALUATOR
        )

    async def own_id(self) -> bool:
        """Whether no older Experiment runs as this one's user id; else it ends Failed, saying which.

        Ids are hashed, so two experiments can share one (rarely); the one created later yields, before
        its folder or its pods exist. Finished experiments count too: their files stay.
        """
        namespaces: list[str | None] = list(self.settings.watch_namespaces) or [None]
        metas = [
            item["metadata"]
            for namespace in namespaces
            for item in await self.context.kube.list(EXPERIMENTS, namespace)
        ]
        age = {ExperimentRef(meta["name"], meta["namespace"], meta["uid"]): _created(meta) for meta in metas}
        mine = _created(self.body["metadata"])
        older = [other for other in id_collisions(self.ref, age, self.settings) if age[other] < mine]
        if older:
            other = older[0]
            await self.fail(
                f"this experiment would run as user id {agent_run_as_id(self.ref, self.settings)}, which "
                f"experiment {other.namespace}/{other.name} already has (ids are hashed from the namespace "
                "and name); apply it under another name",
                Reason.ID_COLLISION,
            )
            return False
        return True

    # --- Baseline: wait for the base model's score, then start the agent ------------------------------

    async def baseline(self) -> None:
        view = await self._view()
        if view is None:
            return
        baseline = view.baseline_status
        if baseline is None:
            await self.context.grader.baseline(self.ref.grader_name)
            return
        if baseline == "failed":
            await self.fail(
                f"the base model could not be evaluated: {view.baseline_error or 'unknown error'}",
                Reason.BASELINE_FAILED,
            )
            return
        if baseline != "scored":
            await self.baseline_waits(view)
            return
        if not await self.sync_policy():
            return
        await self._adopt_and_create(JOBS, build_agent_job(self.ref, self.spec, self.settings))
        message = "the agent Job is waiting for its pod"
        extra = merged(status_from_view(view), self._evaluators_condition(Reason.POD_STARTING, message))
        await self._move(Phase.RUNNING, message, extra, reason=Reason.POD_STARTING)

    async def baseline_waits(self, view: ExperimentAnswer) -> None:
        """Say what the baseline waits for: an evaluator to take it (its queue position, how many
        evaluators are alive; EvaluatorsUnavailable past the grader's limit), or its evaluation."""
        if view.waiting is not None:
            reason = reason_named(view.waiting.reason, default=Reason.EVALUATING_BASELINE)
            message = view.waiting.message
        else:
            reason = Reason.EVALUATING_BASELINE
            who = "" if view.evaluators is None else f"; {evaluators_phrase(view.evaluators, _backend(view))}"
            message = f"evaluating the base model{who}"
        extra = merged(status_from_view(view), self._evaluators_condition(reason, message))
        await self._move(Phase.BASELINE, message, extra, reason=reason)

    def _evaluators_condition(self, reason: Reason, message: str) -> ExperimentResourceStatus:
        conditions = evaluators_condition(
            self.status.get("conditions"),
            unavailable=reason is Reason.EVALUATORS_UNAVAILABLE,
            reason=reason.value,
            message=status_text(message),
            now=datetime.now(UTC),
        )
        return conditions_status(conditions)

    async def sync_policy(self) -> bool:
        """Create or refresh the agent's NetworkPolicy; False (and Failed) when its egress is refused."""
        hosts = [rule.host for rule in self.spec.egress or [] if rule.host is not None]
        resolved = await resolve_hosts(hosts) if hosts else {}
        try:
            policy = build_network_policy(self.ref, self.spec, self.settings, resolved)
        except ValueError as exc:
            # Validated at creation; only cluster ranges widened since then can get here.
            await self.fail(f"invalid spec: {exc}", Reason.INVALID_SPEC)
            return False
        created = await self._adopt_and_create(NETWORK_POLICIES, policy)
        if not created and hosts:
            existing = await self._child(NETWORK_POLICIES, self.ref.policy_name)
            if existing is not None and existing.get("spec") != policy["spec"]:
                # Addresses behind a name change (CDNs): the agent keeps reaching what the spec allows.
                await self.context.kube.patch(
                    NETWORK_POLICIES, self.ref.namespace, self.ref.policy_name, {"spec": policy["spec"]}
                )
        return True

    # --- Running: the budget starts with the agent's container; watch the Job and the clock -----------

    async def running(self) -> None:
        view = await self._view()
        if view is None:
            return
        job = await self._child(JOBS, self.ref.agent_job_name)
        state = job_status(job)
        wait = None
        if view.start_time is None and job is not None:
            pods = await self._pods(job)
            started = self.agent_started(job, pods)
            if started is None and not state.state.ended:
                wait = await self.pod_wait(job, "agent", pods)
            if started is not None or state.state.ended:
                # Ended without a container ever seen running (it failed to start): close the clock now.
                view = await self.context.grader.start(self.ref.grader_name, started)
        if any(rule.host for rule in self.spec.egress or []) and not await self.sync_policy():
            await self.context.kube.delete(JOBS, self.ref.namespace, self.ref.agent_job_name)
            return
        end_time = view.end_time
        if job is not None and not state.state.ended:
            await self.hold_deadline(job, end_time)
        past_deadline = end_time is not None and time.time() > end_time + self.settings.deadline_grace_s
        outcome = agent_outcome(state, past_deadline=past_deadline)
        synced = status_from_view(view)
        if outcome is None:
            if wait is not None:
                await self._move(Phase.RUNNING, wait.message, synced, reason=wait.reason)
            elif view.start_time is None:
                await self._move(
                    Phase.RUNNING, "the agent Job is waiting for its pod", synced, reason=Reason.POD_STARTING
                )
            else:
                await self._move(Phase.RUNNING, "the agent is training", synced, reason=Reason.TRAINING)
            return
        if outcome.phase is Phase.TIMED_OUT and not state.state.ended:
            await self.context.kube.delete(JOBS, self.ref.namespace, self.ref.agent_job_name)
        condition = outcome_condition(outcome, datetime.now(UTC))
        await self._move(
            Phase.FINISHING,
            f"{outcome.message}; waiting for evaluations in flight",
            merged(synced, conditions_status(with_condition(self.status.get("conditions"), condition))),
            reason=Reason.EVALUATIONS_IN_FLIGHT,
        )

    async def _readable(
        self, resource: Resource, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]] | None:
        """The objects of ``resource`` in the experiment's namespace that match the selectors; None
        when this controller may not read them (an older Role)."""
        try:
            return await self.context.kube.list(
                resource, self.ref.namespace, label_selector=label_selector, field_selector=field_selector
            )
        except KubeError as exc:
            if exc.status != 403:
                raise
            return None

    async def _pods(self, job: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The Job's pods; None when this controller may not read pods (an older Role)."""
        uid = job["metadata"].get("uid", "")
        pods = await self._readable(PODS, label_selector=f"batch.kubernetes.io/controller-uid={uid}")
        if pods is None:
            return None
        # Only this Job's own pods (an earlier run's, still terminating, never count).
        return [
            pod
            for pod in pods
            if any(
                owner.get("uid") == uid for owner in (pod.get("metadata") or {}).get("ownerReferences") or []
            )
        ]

    def agent_started(self, job: dict[str, Any], pods: list[dict[str, Any]] | None) -> float | None:
        """When the agent's container started running (None: not yet).

        Not the Job's creation nor its first active pod: Kueue may hold the Job for quota, and a pod is
        active while Pending, scheduling and pulling images; none of that is the agent's time.
        """
        if pods is None:
            # A controller not allowed to read pods: the Job's count of ready pods (containers
            # running) is the next best sign; the clock then starts when it is seen.
            ready = (job.get("status") or {}).get("ready") or 0
            return time.time() if ready > 0 else None
        return agent_running_since(pods, job["metadata"].get("uid", ""), AGENT_CONTAINER)

    async def pod_wait(
        self, job: dict[str, Any], what: str, pods: list[dict[str, Any]] | None = None
    ) -> PodWait | None:
        """Why the Job's pod does not run: the Job held, the pod refused, unschedulable, its image
        not pulled, its container not created or crashing (from pods, then Warning Events)."""
        held = job_wait(job, what)
        if held is not None:
            return held
        if pods is None:
            pods = await self._pods(job)
            if pods is None:
                return None
        found = pod_wait(pods, what)
        if found is not None:
            return found
        live = [p for p in pods if (p.get("status") or {}).get("phase") in (None, "Pending")]
        if pods and not live:
            return None
        about = live[0]["metadata"]["name"] if live else job["metadata"]["name"]
        events = await self._readable(EVENTS, field_selector=f"involvedObject.name={about}")
        if events is None:
            return None
        mine = [e for e in events if (e.get("involvedObject") or {}).get("name") == about]
        return event_wait(mine, what, has_pods=bool(pods))

    async def hold_deadline(self, job: dict[str, Any], end_time: float | None) -> None:
        """Let Kubernetes itself stop the agent at its budget's end, whether or not we are running then."""
        wanted = agent_deadline_s(job, end_time, slack_s=agent_deadline_slack_s(self.spec, self.settings))
        if wanted is not None and job["spec"].get("activeDeadlineSeconds") != wanted:
            await self.context.kube.patch(
                JOBS, self.ref.namespace, self.ref.agent_job_name, {"spec": {"activeDeadlineSeconds": wanted}}
            )

    # --- Finishing: let evaluations in flight complete, then close the experiment ----------------------

    async def finishing(self) -> None:
        conditions = self.status.get("conditions")
        outcome = outcome_from_conditions(conditions) or Outcome(
            Phase.FAILED, "failed", "the agent's outcome was lost"
        )
        view = await self._view()
        if view is None:
            return
        since = agent_finished_since(conditions)
        waited = time.time() - since if since is not None else 0.0
        sealed = view.feedback == Feedback.SEALED
        # A sealed experiment's one test evaluation comes after its validation ones: it has finish
        # waits of its own, one for each time it may be made (again after a failure of the platform's).
        limit = self.settings.finish_wait_s * (1 + MAX_FINAL_ATTEMPTS if sealed else 1)
        if view.in_flight > 0 and waited < limit:
            await patch_status(self.context, self.body, self.status, status_from_view(view))
            return
        if sealed and view.status in ("pending", "running") and final_to_make(view) and waited < limit:
            # The grader makes it, or makes it again, or answers the one it has (then we finish).
            view = await self.context.grader.final(self.ref.grader_name)
            if view.in_flight > 0:
                await patch_status(self.context, self.body, self.status, status_from_view(view))
                return
        if view.status in ("pending", "running"):
            view = await self.context.grader.finish(
                self.ref.grader_name, outcome.grader_status, bounded(outcome.message)
            )
        view = await self.provenance_checked(view)
        if view is None:
            return
        unchecked = self._unchecked(view)
        verified = provenance_condition(view, unchecked, datetime.now(UTC))
        await self._move(
            outcome.phase,
            summary(outcome, view, unchecked=unchecked),
            merged(
                status_from_view(view),
                conditions_status(with_condition(self.status.get("conditions"), verified)),
            ),
            reason=outcome.reason,
        )

    def _unchecked(self, view: ExperimentAnswer) -> str:
        """Why the check of the agent's files was not made, where it was not ("" where it was)."""
        if check_made(view.test_overlap, view.message):
            return ""
        wait = self.settings.provenance_wait_s
        if wait <= 0:
            return "the check is off (provenance_wait_s is 0)"
        return f"the check was not recorded within {wait:g} s of the close (refused, failed or still running)"

    async def provenance_checked(self, view: ExperimentAnswer) -> ExperimentAnswer | None:
        """Once the experiment is closed: have the evaluators check what its agent brought in (the
        grader copies its files and queues the check), and wait for it, at most ``provenance_wait_s``
        from the close. The latest view, or None while it waits."""
        if check_made(view.test_overlap, view.message) or self.settings.provenance_wait_s <= 0:
            return view
        closed = view.finished_at if view.finished_at is not None else time.time()
        if time.time() - closed >= self.settings.provenance_wait_s:
            return view
        waiting = await self.agent_pod_wait()
        if waiting:
            await self._move(
                Phase.FINISHING, waiting, status_from_view(view), reason=Reason.EVALUATIONS_IN_FLIGHT
            )
            return None
        try:
            checked = await self.context.grader.check_provenance(self.ref.grader_name)
        except GradingError as exc:
            if exc.retryable:
                raise
            # A grader that refuses the check (one older than it): the experiment ends without it.
            log.warning("event=provenance_refused experiment=%s reason=%s", self.ref.name, exc.detail)
            return view
        if check_made(checked.test_overlap, checked.message):
            return checked
        view = checked
        await self._move(
            Phase.FINISHING,
            "checking the agent's files for test questions and scoring the final on the twin split",
            status_from_view(view),
            reason=Reason.EVALUATIONS_IN_FLIGHT,
        )
        return None

    async def agent_pod_wait(self) -> str:
        """What the check waits for while a pod of the agent's Job may still run ("" once none
        can): the Job's verdict comes before its pods end, and a Job deleted at the deadline leaves
        its pods their grace period. Its files are read once none runs, so that the agent cannot
        react. Where this controller may not read pods (403), a pod is taken to run until its grace
        period (``agent_stop_grace_s``, the pod's terminationGracePeriodSeconds) has passed since
        the agent finished, never to have stopped."""
        pods = await self._readable(PODS, label_selector=f"job-name={self.ref.agent_job_name}")
        if pods is None:
            since = agent_finished_since(self.status.get("conditions"))
            grace = self.settings.agent_stop_grace_s + POD_GRACE_SLACK_S
            if since is None or time.time() - since < grace:
                return (
                    "the agent's pods cannot be read (403): waiting its pods' grace period "
                    f"({grace} s) before its files are read"
                )
            return ""
        running = (None, "Pending", "Running")
        if any((pod.get("status") or {}).get("phase") in running for pod in pods):
            return "waiting for the agent's pod to stop before its files are read"
        return ""

    async def _view(self) -> ExperimentAnswer | None:
        """The grader's view of the experiment; None (and Failed) when the grader has none."""
        try:
            return await self.context.grader.experiment(self.ref.grader_name)
        except ExperimentNotFoundError:
            await self.fail(
                f"the grader has no experiment {self.ref.grader_name!r} (was its database reset?)",
                Reason.EXPERIMENT_LOST,
            )
            return None


def final_to_make(view: ExperimentAnswer) -> bool:
    """A sealed experiment whose one test evaluation is not created yet, with a submission to take,
    or whose final failed (the grader decides whether to make it again: only after a failure of the
    platform's, and answers the failed one otherwise, which ends the wait)."""
    final = view.final
    return final is not None and (final.submission_id is None or final.status == "failed")


def _created(meta: dict[str, Any]) -> tuple[str, str, str]:
    """Creation order, ties broken by namespace and name: of two experiments, the older keeps an id."""
    return (str(meta.get("creationTimestamp") or ""), str(meta["namespace"]), str(meta["name"]))


def summary(outcome: Outcome, view: ExperimentAnswer, *, unchecked: str = "") -> str:
    """The final message: how it ended and what it scored, what the checks after the agent found,
    and what they could not verify (``unchecked``: why the check of its files was not made)."""
    sealed = view.feedback == Feedback.SEALED
    # The best submission against the baseline on its own split (sealed: validation).
    best, improvement = view.best_score, view.improvement
    baseline = view.validation_baseline_score if sealed else view.baseline_score
    if best is None:
        scored = "no submission was scored"
    else:
        scored = f"best {best:.2f} vs baseline {baseline:.2f}" if baseline is not None else f"best {best:.2f}"
        if improvement is not None:
            scored += f" ({improvement:+.2f})"
    final = view.final
    if sealed and best is not None:
        scored += " on validation; " + (
            f"final {final.score:.2f} on test ({final.selection})"
            if final is not None and final.score is not None
            else "no final score on test"
        )
    found = provenance_findings(view)
    if unchecked:
        found.append(note(TEST_UNVERIFIED, unchecked))
    flagged = "".join(f"; {finding}" for finding in found)
    return f"{outcome.message}; {scored} over {view.submissions} scored submission(s){flagged}"


def _backend(view: ExperimentAnswer) -> str:
    return str(view.eval_config.get("backend", "hf"))
