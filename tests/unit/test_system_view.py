"""The system part of the agent's filesystem view (``system_args``) on hosts shaped unlike this
one: a system that is not merged-usr (real /bin, /lib64 folders) and a host with NVIDIA GPUs, whose
device nodes a training agent needs. The sandbox tests run the view for real on this machine's
merged-usr, GPU-less system; these give the same function another host root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autorl_agent_runner.sandbox.filesystem_view import system_args


def _holds(args: list[str], *run: str) -> bool:
    """Whether ``run`` appears in ``args`` as consecutive items (an option and its operands)."""
    return any(args[i : i + len(run)] == list(run) for i in range(len(args) - len(run) + 1))


def _operands(args: list[str], option: str) -> list[tuple[str, str]]:
    return [(args[i + 1], args[i + 2]) for i, item in enumerate(args) if item == option]


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host root with /usr, real /bin and /lib64 folders, /lib a link into /usr, no /sbin."""
    for folder in ("usr/lib", "usr/bin", "bin", "lib64", "etc", "sys/class"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "lib").symlink_to("usr/lib")
    return tmp_path


def test_real_system_folders_are_bound_read_only_at_their_own_paths(host: Path) -> None:
    args = system_args(host)
    assert _holds(args, "--ro-bind", str(host / "usr"), "/usr")
    assert _holds(args, "--ro-bind", str(host / "bin"), "/bin")
    assert _holds(args, "--ro-bind", str(host / "lib64"), "/lib64")
    assert _holds(args, "--symlink", "usr/lib", "/lib")
    assert not any(item.endswith("sbin") for item in args), "a folder the host lacks is not made up"
    assert _holds(args, "--ro-bind-try", str(host / "etc/ld.so.cache"), "/etc/ld.so.cache")
    assert _holds(args, "--ro-bind-try", str(host / "sys/devices/system/cpu"), "/sys/devices/system/cpu")
    assert _holds(args, "--ro-bind-try", str(host / "sys/devices/system/node"), "/sys/devices/system/node")
    # Nothing else of /sys: no network interfaces (their MAC addresses), no other device.
    assert not [item for item in args if item.startswith(("/sys/class", "/sys/bus", "/sys/dev/"))]


def test_gpu_device_nodes_are_passed_through_after_the_minimal_dev(host: Path) -> None:
    (host / "dev" / "nvidia-caps").mkdir(parents=True)
    for node in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (host / "dev" / node).touch()
    args = system_args(host)
    bound = _operands(args, "--dev-bind")
    assert {target for _, target in bound} == {
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-caps",
    }
    assert all(source == str(host) + target for source, target in bound)
    # bubblewrap applies its arguments in order: a --dev after them would hide the GPUs again.
    first_gpu = args.index("--dev-bind")
    assert _holds(args[:first_gpu], "--dev", "/dev") and "--dev" not in args[first_gpu:]


def test_a_host_without_gpus_binds_no_device(host: Path) -> None:
    assert "--dev-bind" not in system_args(host)


def test_the_real_root_gives_the_hosts_own_paths() -> None:
    args = system_args()
    assert _holds(args, "--ro-bind", "/usr", "/usr")
    for name in ("bin", "lib"):
        root_path = Path("/") / name
        if root_path.is_symlink():
            assert _holds(args, "--symlink", os.readlink(root_path), f"/{name}")


def test_only_the_gpus_pci_devices_are_shown_of_the_hosts_devices(host: Path) -> None:
    root = host / "sys/devices/pci0000:00/0000:00:01.0"
    listing = host / "sys/bus/pci/devices"
    listing.mkdir(parents=True)
    for address, vendor in (("0000:03:00.0", "0x10de"), ("0000:04:00.0", "0x8086")):  # a GPU, a NIC
        (root / address / "net").mkdir(parents=True)
        (root / address / "vendor").write_text(vendor + "\n")
        (listing / address).symlink_to(f"../../../devices/pci0000:00/0000:00:01.0/{address}")
    args = system_args(host)
    assert _operands(args, "--ro-bind")[-1] == (
        str(root / "0000:03:00.0"),
        "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0",
    )
    assert _holds(
        args,
        "--symlink",
        "../../../devices/pci0000:00/0000:00:01.0/0000:03:00.0",
        "/sys/bus/pci/devices/0000:03:00.0",
    )
    assert not [item for item in args if "0000:04:00.0" in item]
