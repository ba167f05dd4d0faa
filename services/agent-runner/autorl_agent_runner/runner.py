"""Run one agent under its time budget: start it, keep the mirrors fresh, end it at the deadline.

The budget's truth is the grader (``GET /time``): the runner reads ``end_time`` from it when
the agent starts, and falls back to ``now + timeout_s`` only where the grader has no budget.

Two logs, each of one source. The runner's own events (``event=agent_start``, deadlines,
kills) go to a log the agent cannot write: a file outside the workspace (``autorl run``:
``runs/<id>/logs/runner.log``) or the runner's stderr (a pod's own stream). The agent's output
reaches ``agent.log`` through a pipe that the runner copies: the agent never holds the file, so it
cannot truncate it or seek in it, and nothing it prints lands among the platform's events.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from autorl.client import GradingClient
from autorl.errors import AutoRLError
from autorl.parent_death import dying_with_parent
from autorl.process_group import kill_group
from autorl.untrusted_text import printable
from autorl_agent_runner.agent_command import AgentCommand
from autorl_agent_runner.sandbox.agent_user import give_to_agent, reclaim
from autorl_agent_runner.sandbox.api_relay import AgentApiRelay
from autorl_agent_runner.sandbox.egress import Egress, Network
from autorl_agent_runner.sandbox.environment import ContractValues, build_agent_env
from autorl_agent_runner.sandbox.netns import listen_in_netns
from autorl_agent_runner.sandbox.plan import (
    SandboxMode,
    SandboxPlan,
    SandboxRequest,
    can_share_base_model,
    plan_sandbox,
)
from autorl_agent_runner.sandbox.processes import AgentProcesses, end_processes, keep_from_agent
from autorl_agent_runner.workspace.layout import Workspace, detach_model, open_platform_log, write_run_meta
from autorl_agent_runner.workspace.mirrors import MIRROR_INTERVAL_S, refresh_mirrors, write_mirror

#: Default seconds between SIGTERM and SIGKILL at the deadline.
GRACE_PERIOD_S = 30.0
#: The largest piece of the agent's output copied at once (``echo_output``).
_CHUNK = 65536
_TICK_S = 0.25
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: What marks the agent's lines where they share a stream with the runner's (a pod's log).
AGENT_LINE_PREFIX = b"[agent] "


class AgentStartError(AutoRLError):
    """The agent's program could not be executed."""


EventSink = Callable[[str, Mapping[str, object]], None]


@dataclass
class RunnerConfig:
    workspace: Workspace
    contract: ContractValues
    agent: AgentCommand
    passed_env: Mapping[str, str] = field(default_factory=dict)
    platform_env: Mapping[str, str] = field(default_factory=dict)
    sandbox: SandboxMode = SandboxMode.AUTO
    #: Platform folders (home, caches, data sources, evaluator storage): the sandbox's view is an
    #: allow-list that never holds them, and refuses to start rather than expose one.
    hidden: Sequence[Path] = ()
    #: Internet access for the agent (an outside LLM API), never the host's services.
    egress: bool = False
    #: Non-public destinations (private networks, the host's addresses) the operator lets the
    #: agent reach through ``egress``; every other one is refused.
    egress_allow: tuple[Network, ...] = ()
    grace_period_s: float = GRACE_PERIOD_S
    mirror_interval_s: float = MIRROR_INTERVAL_S
    #: Used only when the grader reports no budget (a runner started on its own).
    timeout_s: float | None = None
    #: Also copy the agent's output to the runner's stdout (in a pod, what ``kubectl logs`` shows),
    #: each line marked ``[agent]`` and escaped. agent.log gets it either way.
    echo_output: bool = False
    #: The runner's own log, a file the agent cannot reach (``runs/<id>/logs/runner.log``); None:
    #: the runner's stderr (a pod's own stream).
    runner_log: Path | None = None


@dataclass
class AgentOutcome:
    exit_code: int | None
    #: The deadline came while the agent still ran.
    timed_out: bool
    #: Something (Ctrl-C, SIGTERM to the runner) stopped the agent before its deadline.
    interrupted: bool
    #: SIGKILL was needed after the grace period.
    killed: bool
    start_time: float
    end_time: float
    finished_at: float
    sandbox: str


class AgentRunner:
    """Starts one agent and watches it. ``run()`` does everything; ``stop()`` may come from another thread."""

    def __init__(
        self, config: RunnerConfig, client: GradingClient, on_event: EventSink | None = None
    ) -> None:
        self.config = config
        self.client = client
        self._on_event = on_event
        self._stop = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._processes: AgentProcesses | None = None
        self._plan: SandboxPlan | None = None
        self._relay: AgentApiRelay | None = None
        self._egress: Egress | None = None
        self._agent_log: IO[bytes] | None = None
        self._log_lock = threading.Lock()
        self._pump: threading.Thread | None = None
        self._echo = config.echo_output
        self._echo_at_line_start = True
        self._next_mirror = 0.0
        self.start_time = 0.0
        self.end_time = 0.0
        #: When the agent's run ended (its last process gone); None while it runs.
        self.finished_at: float | None = None
        self._last_submit_time: float | None = None

    # --- logging -------------------------------------------------------------------------

    def log(self, line: str) -> None:
        """A platform event, on one line (whatever a quoted string holds), in the runner's own log."""
        text = f"[autorl {time.strftime('%H:%M:%S')}] {printable(line)}\n"
        path = self.config.runner_log
        with self._log_lock:
            try:
                if path is None:
                    sys.stderr.write(text)
                    sys.stderr.flush()
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with path.open("a", encoding="utf-8") as events:
                        events.write(text)
            except (OSError, ValueError):
                pass  # a full disk or a closed stderr must not end the run its log describes

    def _copy_output(self, fd: int) -> None:
        """Copy the agent's output pipe to agent.log (and stdout) until every writer has closed it."""
        try:
            while chunk := os.read(fd, _CHUNK):
                with self._log_lock:
                    if self._agent_log is not None:
                        try:
                            self._agent_log.write(chunk)
                            self._agent_log.flush()
                        except OSError:
                            pass  # a full disk: the agent's output is dropped, the run goes on
                    if self._echo:
                        self._echo_chunk(chunk)
        finally:
            os.close(fd)

    def _echo_chunk(self, chunk: bytes) -> None:
        """The agent's output on stdout, each line marked as the agent's and escaped, so that it
        can neither pass for one of the runner's lines nor drive a terminal."""
        lines = chunk.split(b"\n")
        out = bytearray()
        for index, part in enumerate(lines):
            last = index == len(lines) - 1
            if last and not part:
                break  # the chunk ended with a line feed
            if self._echo_at_line_start:
                out += AGENT_LINE_PREFIX
            out += printable(part.decode("utf-8", errors="replace")).encode()
            if not last:
                out += b"\n"
            self._echo_at_line_start = not last
        try:
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
        except (OSError, ValueError):
            # Nobody reads stdout any more: agent.log still gets everything.
            self._echo = False

    def _event(self, name: str, **fields: object) -> None:
        if self._on_event is not None:
            self._on_event(name, fields)

    # --- lifecycle -------------------------------------------------------------------------

    def run(self) -> AgentOutcome:
        try:
            self.start()
            return self.supervise()
        except AgentStartError:
            raise  # start() has already ended what it had started
        except BaseException:  # Ctrl-C in the caller, even mid-start: end the agent before passing it on
            if self._process is None:
                raise  # nothing of the agent was started
            self.log("event=interrupted action=SIGTERM")
            try:
                self._end()
            except BaseException:  # a second Ctrl-C: no more grace
                self._end(grace_period_s=0.0)
                raise
            finally:
                self._finish(timed_out=False, interrupted=True, killed=True)
            raise

    def start(self) -> None:
        config, workspace = self.config, self.config.workspace
        self.start_time, self.end_time = self._budget()
        self._write_run_meta()
        grader = urllib.parse.urlsplit(config.contract.grading_server_url)
        self._plan = plan_sandbox(
            config.sandbox,
            SandboxRequest(
                workspace=workspace.root,
                read_only=workspace.read_only_dirs,
                python_env=config.agent.python,
                program=config.agent.script,
                forbidden=[p.expanduser().absolute() for p in config.hidden],
                loopback_grader=grader.hostname in _LOOPBACK_HOSTS,
                egress=config.egress,
            ),
        )
        plan = self._plan
        if not can_share_base_model(plan.mode):
            detach_model(workspace)
        if plan.uid is not None and plan.gid is not None:
            give_to_agent([workspace.root, workspace.code, workspace.output], plan.uid, plan.gid)
        marker = secrets.token_hex(16)
        env = build_agent_env(
            config.contract,
            {**config.agent.env, **config.passed_env},
            run_marker=marker,
            extra_platform=config.platform_env,
            python_env=config.agent.python,
        )
        self._agent_log = open_platform_log(workspace.agent_log)
        if plan.warning:
            print(plan.warning, file=sys.stderr)
            self.log(plan.warning)
        for note in plan.notes:
            self.log(f"event=sandbox_note note={note!r}")
        network = "egress" if plan.egress else "loopback" if plan.network_isolated else "host"
        self.log(
            f"event=agent_start agent={config.agent.name} sandbox={plan.mode.value} network={network} "
            f"timeout_s={self.end_time - self.start_time:.0f} end_time={self.end_time:.0f}"
        )
        keep_from_agent()
        # The agent writes into a pipe that a thread copies: it never holds agent.log itself.
        read_fd, write_fd = os.pipe()
        try:
            self._process = subprocess.Popen(
                dying_with_parent(plan.command(config.agent.argv)),
                cwd=workspace.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=plan.pass_fds,
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            self._close_agent_log()
            self.log(f"event=agent_not_started error={exc.strerror}")
            plan.cleanup()
            raise AgentStartError(
                f"agent {config.agent.name} cannot be started ({exc.strerror}); an executable script "
                "needs a shebang line such as #!/usr/bin/env python3"
            ) from exc
        os.close(write_fd)
        self._pump = threading.Thread(
            target=self._copy_output, args=(read_fd,), name="agent-output", daemon=True
        )
        self._pump.start()
        plan.started()
        namespace_init = None
        if plan.gate is not None:
            try:
                sandbox_pid = plan.gate.wait_started()
                self._connect(sandbox_pid, grader)
                plan.gate.release()
            except AutoRLError as exc:
                self.log(f"event=sandbox_failed error={exc}")
                self._process.kill()
                self._process.wait()
                self._close_network()
                if plan.uid is not None:
                    self._give_back()
                plan.cleanup()
                # bubblewrap's own message reaches agent.log before it closes.
                self._pump.join(timeout=5.0)
                self._close_agent_log()
                message = f"the agent's sandbox could not start: {exc}; see {workspace.agent_log}"
                raise AgentStartError(message) from exc
            if plan.pid_namespace:
                namespace_init = sandbox_pid
        self._processes = AgentProcesses(
            self._process.pid,
            marker,
            uid=plan.uid,
            gid=plan.gid,
            wrapped=plan.mode is not SandboxMode.NONE,
            namespace_init=namespace_init,
        )
        self._event("agent_started", pid=self._process.pid, sandbox=plan.mode.value, end_time=self.end_time)

    def _connect(self, sandbox_pid: int, grader: urllib.parse.SplitResult) -> None:
        """Forward the grader's agent API into the sandbox's loopback; add egress if asked."""
        assert self._plan is not None
        if self._plan.network_isolated and grader.hostname is not None:
            port = grader.port or 80
            try:
                listener = listen_in_netns(sandbox_pid, "127.0.0.1", port)
            except OSError as exc:
                raise AgentStartError(f"cannot forward the grader into the sandbox: {exc}") from exc
            self._relay = AgentApiRelay(
                listener,
                upstream_host=grader.hostname,
                upstream_port=port,
                token=self.config.contract.token,
                log=self.log,
            )
            self._relay.start()
        if self._plan.egress:
            self._egress = Egress.start(sandbox_pid, self.config.egress_allow)

    def _close_network(self) -> None:
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._egress is not None:
            self._egress.close()
            self._egress = None

    def _budget(self) -> tuple[float, float]:
        try:
            info = self.client.time()
        except AutoRLError as exc:
            info = None
            reason = str(exc)
        else:
            reason = "the grader reports no budget"
        if info is not None and info.start_time is not None and info.end_time is not None:
            return info.start_time, info.end_time
        if self.config.timeout_s is None:
            raise AutoRLError(f"no time budget: {reason}; start the experiment's budget or pass --timeout")
        now = time.time()
        return now, now + self.config.timeout_s

    def supervise(self) -> AgentOutcome:
        assert self._process is not None
        while True:
            if self._process.poll() is not None:
                self.log(f"event=agent_exit code={self._process.returncode}")
                return self._finish(timed_out=False, interrupted=False)
            now = time.time()
            if now >= self.end_time:
                self.log("event=deadline action=SIGTERM")
                self._event("deadline")
                killed = self._end()
                return self._finish(timed_out=True, interrupted=False, killed=killed)
            if self._stop.is_set():
                self.log("event=stop_requested action=SIGTERM")
                killed = self._end()
                return self._finish(timed_out=False, interrupted=True, killed=killed)
            if now >= self._next_mirror:
                self.refresh_mirrors()
                self._next_mirror = now + self.config.mirror_interval_s
            time.sleep(min(_TICK_S, max(0.01, self.end_time - now)))

    def stop(self) -> None:
        """Ask the supervising loop to end the agent now (Ctrl-C, the runner's own SIGTERM)."""
        self._stop.set()

    def _end(self, grace_period_s: float | None = None) -> bool:
        assert self._process is not None
        process = self._process
        grace = self.config.grace_period_s if grace_period_s is None else grace_period_s
        if self._processes is None:
            # Interrupted while starting, before its processes were known: its session's group.
            kill_group(process.pid, process, grace_s=grace)
            return True

        def reap() -> None:
            process.poll()

        killed, _ = end_processes(self._processes, grace_period_s=grace, reap=reap, log=self.log)
        process.wait()
        return killed

    def _finish(self, *, timed_out: bool, interrupted: bool, killed: bool = False) -> AgentOutcome:
        """After the leader exited: end stragglers, refresh the mirrors, give the files back.

        The files are given back whatever happened before (``finally``): nothing the agent left in
        its workspace may keep them its own.
        """
        process, plan = self._process, self._plan
        try:
            if self._processes is not None and self._processes.alive():
                # The agent exited but left processes behind: they end with it.
                self.log("event=agent_leftovers action=SIGTERM")
                killed = self._end() or killed
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
            self._close_network()
            self.finished_at = time.time()
            self.refresh_mirrors()
        finally:
            if plan is not None:
                try:
                    if plan.uid is not None:
                        self._give_back()
                finally:
                    plan.cleanup()
        finished = self.finished_at if self.finished_at is not None else time.time()
        outcome = AgentOutcome(
            exit_code=process.returncode if process is not None else None,
            timed_out=timed_out,
            interrupted=interrupted,
            killed=killed,
            start_time=self.start_time,
            end_time=self.end_time,
            finished_at=finished,
            sandbox=plan.mode.value if plan else "none",
        )
        self.log(
            f"event=agent_finished exit_code={outcome.exit_code} timed_out={timed_out} "
            f"interrupted={interrupted} killed={killed}"
        )
        self._event("agent_finished", outcome=outcome)
        if self._pump is not None:
            # Every writer is gone (the agent and all it started): the copy reaches the end at once.
            self._pump.join(timeout=5.0)
            self._pump = None
        self._close_agent_log()
        return outcome

    def _give_back(self) -> None:
        """The workspace back to the platform's user (the agent's uid then owns nothing)."""
        root = self.config.workspace.root
        try:
            failed = reclaim(root)
        except OSError as exc:
            self.log(f"event=give_back_incomplete error={exc.strerror or type(exc).__name__}")
            return
        if failed:
            self.log(f"event=give_back_incomplete entries={failed}")

    def _close_agent_log(self) -> None:
        with self._log_lock:
            if self._agent_log is not None:
                self._agent_log.close()
                self._agent_log = None

    def _write_run_meta(self) -> None:
        """run_meta.json from what the runner knows itself (at the start, or with no grader)."""
        workspace = self.config.workspace
        write_mirror(
            workspace.run_meta,
            lambda: write_run_meta(
                workspace,
                start_time=self.start_time,
                timeout_s=round(self.end_time - self.start_time),  # whole seconds, as the grader's
                last_submit_time=self._last_submit_time,
                deadline=self.end_time,
                end_time=self.finished_at,
            ),
            self.log,
        )

    def refresh_mirrors(self) -> None:
        """Copy the grader's view into run_meta.json and scores.json (best effort: a mirror).

        The grader's budget is the truth: when it starts later than the runner did (in a pod the
        controller starts it when the agent's container is running), the deadline follows it.
        """
        try:
            info = refresh_mirrors(
                self.config.workspace,
                self.client,
                start_time=self.start_time,
                deadline=self.end_time,
                ended_at=self.finished_at,
                log=self.log,
            )
        except AutoRLError as exc:
            self.log(f"event=mirror_skipped reason={type(exc).__name__}")
            if self.finished_at is not None:
                # The grader does not answer, yet the run's end belongs in run_meta.json.
                self._write_run_meta()
            return
        self._last_submit_time = info.last_submit_time
        if info.start_time is not None and info.end_time is not None and info.end_time != self.end_time:
            self.log(f"event=budget_from_grader end_time={info.end_time:.0f} was={self.end_time:.0f}")
            self.start_time, self.end_time = info.start_time, info.end_time
