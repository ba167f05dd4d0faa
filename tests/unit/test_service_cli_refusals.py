"""Bad input to the services' commands (`autorl grader`, `worker`, `test-data`, `controller`,
`evaluate`) is refused before anything serves or runs: a message naming the flag or variable and the
fix, exit 2 (1 for what is not the input's fault), never a traceback. Each command runs in-process
and returns before it would serve; a port in use is a real socket held here."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from autorl.cli import main
from autorl.errors import EVALUATOR_FAULT_PREFIX, AutoRLError
from tests.support.infra import free_port


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit code and stderr of `autorl ARGV` (argparse's own refusals included)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    error = capsys.readouterr().err
    assert "Traceback" not in error
    return code, error


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own: SQLite, local dispatch, no GPU device asked for."""
    monkeypatch.setenv("AUTORL_HOME", str(tmp_path / "home"))
    for name in ("AUTORL_DATABASE_URL", "AUTORL_REDIS_URL", "AUTORL_EVAL_DEVICE", "AUTORL_DATA_SOURCE_DIR"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


# `autorl grader`


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--port", "-1"], "--port must be between 1 and 65535, not -1"),
        (["--port", "70000"], "--port must be between 1 and 65535, not 70000"),
        (["--admin-port", "99999"], "--admin-port must be between 1 and 65535, not 99999"),
    ],
)
def test_grader_refuses_a_port_number_no_socket_can_have(
    flags: list[str], named: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refusal(["grader", *flags], capsys) == (2, f"autorl grader: error: {named}\n")


def test_grader_log_level_is_one_of_uvicorns(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, error = refusal(["grader", "--log-level", "bogus"], capsys)
    assert code == 2
    assert "--log-level: invalid choice: 'bogus'" in error and "'warning'" in error


@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
def test_grader_port_in_use_is_bad_input_naming_its_flag(
    flag: str, busy_port: int, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = {"--port": free_port(), "--admin-port": free_port(), flag: busy_port}
    code, error = refusal(["grader", *(str(part) for pair in ports.items() for part in pair)], capsys)
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{busy_port} for {flag}" in error
    assert error.rstrip().endswith(f"pick a free {flag}")


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1"])  # no address at all; none of this machine
@pytest.mark.parametrize("admin", [False, True])
def test_grader_host_that_cannot_be_bound_is_named(
    host: str, admin: bool, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--admin-port", str(free_port())] if admin else []
    code, error = refusal(["grader", "--host", host, "--port", str(free_port()), *extra], capsys)
    assert code == 2
    assert f"--host '{host}' is not an address of this machine" in error
    assert "such as 127.0.0.1" in error


# `autorl worker`


def test_worker_metrics_host_that_is_no_address_names_metrics_host(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["worker", "--burst", "--metrics-host", "999.1.1.1", "--metrics-port", str(free_port())]
    code, error = refusal(argv, capsys)
    assert code == 2
    assert "--metrics-host '999.1.1.1' is not an address of this machine" in error
    assert "pick a valid --metrics-host" in error and "--metrics-port" not in error


def test_worker_metrics_port_in_use_names_metrics_port(
    home: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code, error = refusal(["worker", "--burst", "--metrics-port", str(busy_port)], capsys)
    assert code == 2
    assert error.rstrip().endswith("pick a free --metrics-port")


def test_worker_with_redis_unreachable_says_so_without_its_password(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTORL_REDIS_URL", "redis://:secret-pw@127.0.0.1:1/0")
    code, error = refusal(["worker", "--burst"], capsys)
    assert code == 1  # a service down, not the input
    assert "the queue (Redis) is unreachable" in error and "127.0.0.1:1" in error
    assert "check AUTORL_REDIS_URL and that Redis is running" in error
    assert "secret-pw" not in error


# `autorl test-data`


@pytest.mark.parametrize("url", ["http://[::1", "ftp://host/data", "http://", "http://host:99999/"])
def test_test_data_source_url_is_checked_where_the_flag_is_read(
    url: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, error = refusal(["test-data", "--task", "gsm8k", "--source-url", url], capsys)
    assert code == 2
    assert error.startswith(
        f"autorl test-data: error: --source-url: test data URL {url!r} must be http:// or https://"
    )


def test_test_data_from_a_malformed_split_names_the_file_line_and_fix(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    split = tmp_path / "source" / "gsm8k" / "test.jsonl"
    split.parent.mkdir(parents=True)
    split.write_text("{not json\n", encoding="utf-8")
    monkeypatch.setenv("AUTORL_DATA_SOURCE_DIR", str(split.parent.parent))
    code, error = refusal(["test-data", "--task", "gsm8k"], capsys)
    assert code in (1, 2)  # a ConfigurationError: 2 where autorl counts a setting's as bad input
    assert f"autorl test-data: error: {split}:1: not JSON (" in error
    assert "fix the file or put a good copy in its place" in error
    assert not (home / "eval" / "data" / "gsm8k" / "test.jsonl").exists()  # nothing half-written


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"question": "q", "answer": "a"}\n[1]\n', ':2: expected an object with string "question"'),
        (b"\xff\xfe\n", ": not UTF-8 text"),
    ],
)
def test_a_problems_file_error_is_an_autorl_error_and_still_a_value_error(
    text: str | bytes, said: str, tmp_path: Path
) -> None:
    from autorl.tasks.base import ProblemFileError, read_problems

    path = tmp_path / "test.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ProblemFileError, match="fix the file") as raised:
        read_problems(path)
    assert isinstance(raised.value, AutoRLError) and isinstance(raised.value, ValueError)
    assert str(raised.value).startswith(f"{path}{said}")


# `autorl controller`


@pytest.fixture
def controller_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No in-cluster credentials and no API URL: only KUBECONFIG (or ~/.kube/config) can log in."""
    from autorl_controller.operator.handlers import login

    monkeypatch.setattr(
        login, "SERVICE_ACCOUNT_TOKEN", tmp_path / "no-service-account" / "token", raising=False
    )
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", "a-test-admin-token-0123456789")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("AUTORL_KUBE_API_URL", "AUTORL_WATCH_NAMESPACES", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: dev
contexts: [{name: dev, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
"""


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "which cannot be read (No such file or directory)"),
        ("garbage: [\n", ") is not YAML (line 2:"),
        ("- a list\n", ") is not a kubeconfig (AttributeError:"),
        (KUBECONFIG.replace("current-context: dev", ""), ") sets no current-context"),
        (KUBECONFIG.replace("name: u,", "name: other,"), ") names 'u' (a context, cluster or user"),
    ],
)
def test_controller_refuses_a_kubeconfig_kopf_could_never_log_in_with(
    content: str | None,
    said: str,
    controller_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = controller_env / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content, encoding="utf-8")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    code, error = refusal(["controller"], capsys)
    assert code == 2
    assert said in error
    assert "set KUBECONFIG to your cluster's kubeconfig file" in error


def test_controller_without_any_credentials_says_how_to_give_them(
    controller_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, error = refusal(["controller"], capsys)
    assert code == 2
    assert "no Kubernetes credentials (KUBECONFIG is not set" in error
    assert "AUTORL_KUBE_API_URL" in error


def test_controller_accepts_a_kubeconfig_kopf_can_log_in_with(
    controller_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kopf

    from autorl_controller.operator.handlers.login import check_credentials
    from autorl_controller.operator.settings import ControllerSettings

    kubeconfig = controller_env / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG, encoding="utf-8")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    check_credentials(ControllerSettings())
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    assert info is not None and info.server == "https://127.0.0.1:6443"


@pytest.mark.parametrize("namespace", ["", "Bad_NS!", "a" * 64, "a-"])
def test_controller_namespace_must_be_a_dns_label(
    namespace: str, controller_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, error = refusal(["controller", "-n", "autorl", "-n", namespace], capsys)
    assert code == 2
    assert f"-n/--namespace: {namespace!r} is not a namespace name (a DNS-1123 label" in error


# AUTORL_EVAL_DEVICE


@pytest.mark.parametrize(
    ("device", "gpus", "said"),
    [
        ("cuda:9", 0, "AUTORL_EVAL_DEVICE=cuda:9 but no GPU is visible to the evaluator; set it to cpu"),
        ("cuda:9", 2, "AUTORL_EVAL_DEVICE=cuda:9 but the evaluator sees 2 GPU(s), cuda:0 to cuda:1"),
        ("gpu", 1, "AUTORL_EVAL_DEVICE='gpu' is not a device; set it to cpu, cuda or cuda:N"),
    ],
)
def test_evaluate_refuses_a_device_the_evaluator_cannot_use(
    device: str,
    gpus: int,
    said: str,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("AUTORL_EVAL_DEVICE", device)
    code, error = refusal(["evaluate", "-t", "arith", "builtin:tiny-qwen2"], capsys)
    assert code == 2
    assert said in error
    assert "save_pretrained" not in error


def test_a_submission_on_a_worker_with_a_wrong_device_fails_as_the_evaluators_fault(
    tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from autorl.checkpoints.snapshot import snapshot_base_model
    from autorl.eval_config import EvalConfig
    from autorl.tasks import get_task
    from autorl_evaluator.backends import get_backend
    from autorl_evaluator.failures import EvaluatorFaultError, agent_message
    from autorl_evaluator.settings import WorkerSettings

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    settings = WorkerSettings(home=tmp_path / "home", eval_device="cuda:9")
    assert settings.snapshot_dir is not None
    snapshot = snapshot_base_model(tiny_base_model, settings.snapshot_dir)
    task = get_task("arith")
    problems = task.load_test_problems(settings.eval_dir / "data")[:1]
    with pytest.raises(EvaluatorFaultError) as raised:
        get_backend("hf").evaluate(
            snapshot.path, task, problems, EvalConfig.record("arith", settings), settings
        )
    told = agent_message(raised.value)
    assert told.startswith(EVALUATOR_FAULT_PREFIX) and "AUTORL_EVAL_DEVICE=cuda:9" in told


def test_metrics_bind_failure_names_the_flag_that_is_wrong() -> None:
    from autorl_evaluator.cli import metrics_bind_failure

    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert "pick a valid --metrics-host" in metrics_bind_failure("nowhere", 9100, unknown)
    in_use = OSError(errno.EADDRINUSE, "Address already in use")
    assert metrics_bind_failure("127.0.0.1", 9100, in_use).endswith("pick a free --metrics-port")
