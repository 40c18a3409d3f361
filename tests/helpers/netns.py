"""Cluster nodes on their own network, on this one machine: a Linux bridge in the root network
namespace is the core switch (and holds the database host's address); each node is a network
namespace with an address of a private test subnet, behind an access switch of its own (a
bridge in another namespace) whose uplink reaches the core.

    with node_network(["node1", "node2"]) as net:
        proc = net.nodes["node1"].popen(["tunefleet", "worker", ...])
        net.nodes["node1"].cut()     # the access switch's uplink goes down
        net.nodes["node1"].heal()

A process runs "on" a node when it is started through :meth:`Node.argv`: it enters the node's
network namespace only (``nsenter --net``, so ``/sys`` and its cgroups stay as they are) and a
UTS namespace of its own whose host name is the node's, as on a real cluster node.

A cut sets the access switch's uplink down. The node's own link keeps its carrier, address and
routes, so nothing on the node learns of the cut: its packets vanish one hop away, as when a
switch or a cable beyond the node fails, and its TCP backs off as it would there. (Setting the
node's own port down instead would drop the carrier: Linux then retries locally every half
second and no backoff builds up, the easy case.) Healing sets the uplink up again.

Needs root and ``ip`` (iproute2) with network namespaces, veth and bridges; :func:`unavailable`
says why not where they are missing (tests skip with that reason). Parallel test sessions each
take a network of their own: an index chosen under a lock names the bridges, the namespaces
and the subnet, and a network whose owner process died is removed by the next session that
meets it.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The private test subnets: 10.237.<index>.0/24, one per live network.
SUBNET_PREFIX = "10.237"
MAX_NETWORKS = 200
#: Where parallel sessions agree on who owns which index.
STATE_DIR = Path("/run/tunefleet-test-net")


class NetworkError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def unavailable() -> str | None:
    """Why nodes cannot be made here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"tfprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", probe)
    except (NetworkError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip("-n", probe, "link", "add", "tfa", "type", "veth", "peer", "name", "tfb")
        _ip("-n", probe, "link", "add", "tfbr", "type", "bridge")
    except NetworkError as exc:
        return f"no veth pairs or bridges here: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Node:
    """One node: a network namespace, its address, and its access switch."""

    name: str
    netns: str
    address: str
    switch: str  # the access switch's namespace
    uplink: str  # the access switch's port towards the core, in ``switch``

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this node (its network, its host name)."""
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            self.name,
            *argv,
        ]

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(argv), **kwargs)  # type: ignore[call-overload,no-any-return]

    def cut(self) -> None:
        """The node's uplink goes down: its packets are dropped, nothing tells it so."""
        _ip("-n", self.switch, "link", "set", self.uplink, "down")

    def heal(self) -> None:
        _ip("-n", self.switch, "link", "set", self.uplink, "up")

    @property
    def link_up(self) -> bool:
        shown = _ip("-n", self.switch, "-o", "link", "show", self.uplink).stdout
        return "UP" in shown.split("<", 1)[1].split(">", 1)[0].split(",")

    def pids(self) -> list[int]:
        """Processes in the node's network namespace."""
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]


@dataclass
class NodeNetwork:
    index: int
    bridge: str
    #: The database host's address on the test subnet (the bridge's, in the root namespace).
    gateway: str
    nodes: dict[str, Node] = field(default_factory=dict)

    def close(self) -> None:
        _teardown(self.index)  # by name: a network half built goes too

    def heal_all(self) -> None:
        for node in self.nodes.values():
            node.heal()


def _names(index: int) -> tuple[str, str]:
    """Bridge name and the prefix of this network's other names (interface names: <= 15)."""
    return f"tfbr{index}", f"tf{index}"


def _owner_file(index: int) -> Path:
    return STATE_DIR / f"{index}.owner"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _teardown(index: int) -> None:
    """Remove network ``index``, found by its names: the processes in its namespaces (they
    belong to the session that made them), the namespaces, the core ports and the bridge."""
    bridge, prefix = _names(index)
    listed = [line.split() for line in _ip("netns", "list", check=False).stdout.splitlines()]
    namespaces = [
        words[0] for words in listed if words and words[0].startswith((f"{prefix}n", f"{prefix}s"))
    ]
    for ns in namespaces:
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip("netns", "del", ns, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0] if ":" in line else ""
        if name.startswith(f"{prefix}c") or name == bridge:
            _ip("link", "del", name, check=False)
    with contextlib.suppress(FileNotFoundError):
        _owner_file(index).unlink()


def _subnet_in_use(index: int) -> bool:
    subnet = ipaddress.ip_network(f"{SUBNET_PREFIX}.{index}.0/24")
    for line in _ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = ipaddress.ip_interface(parts[parts.index("inet") + 1])
            if addr.network.overlaps(subnet):
                return True
    return False


def _claim_index() -> int:
    """A free network index, recorded as this process's; stale ones are cleaned on the way."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for index in range(MAX_NETWORKS):
            owner = _owner_file(index)
            if owner.exists():
                try:
                    pid = int(owner.read_text().split()[0])
                except (ValueError, IndexError):
                    pid = 0
                if _alive(pid):
                    continue
                _teardown(index)
            bridge, _ = _names(index)
            if Path(f"/sys/class/net/{bridge}").exists() or _subnet_in_use(index):
                continue
            owner.write_text(f"{os.getpid()}\n")
            return index
    raise NetworkError(f"no free test network among {MAX_NETWORKS}; see {STATE_DIR}")


def _bridge(name: str, *where: str) -> None:
    """A bridge without spanning tree: a port that comes back up forwards at once."""
    _ip(*where, "link", "add", name, "type", "bridge")
    _ip(*where, "link", "set", name, "type", "bridge", "forward_delay", "0", "stp_state", "0")


@contextlib.contextmanager
def node_network(names: Sequence[str]) -> Iterator[NodeNetwork]:
    """A bridge with the database host's address and one node per name (see the module
    docstring); everything is removed on the way out, the nodes' processes included."""
    index = _claim_index()
    bridge, prefix = _names(index)
    net = NodeNetwork(index, bridge, f"{SUBNET_PREFIX}.{index}.1")
    try:
        _bridge(bridge)
        _ip("addr", "add", f"{net.gateway}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names):
            node = Node(
                name=name,
                netns=f"{prefix}n{i}",
                address=f"{SUBNET_PREFIX}.{index}.{10 + i}",
                switch=f"{prefix}s{i}",
                uplink="uplink",
            )
            core_port, nic, access_port = f"{prefix}c{i}", f"{prefix}i{i}", f"{prefix}a{i}"
            _ip("netns", "add", node.netns)
            _ip("netns", "add", node.switch)
            on_switch = ("-n", node.switch)
            _bridge("br0", *on_switch)
            # The uplink: core bridge <-> access switch.
            _ip("link", "add", core_port, "type", "veth", "peer", "name", f"{prefix}u{i}")
            _ip("link", "set", core_port, "master", bridge)
            _ip("link", "set", f"{prefix}u{i}", "netns", node.switch)
            _ip(*on_switch, "link", "set", f"{prefix}u{i}", "name", node.uplink)
            # The node's own link: access switch <-> the node's eth0.
            _ip("link", "add", access_port, "type", "veth", "peer", "name", nic)
            _ip("link", "set", access_port, "netns", node.switch)
            _ip("link", "set", nic, "netns", node.netns)
            for port in (node.uplink, access_port):
                _ip(*on_switch, "link", "set", port, "master", "br0")
                _ip(*on_switch, "link", "set", port, "up")
            _ip(*on_switch, "link", "set", "br0", "up")
            _ip("-n", node.netns, "link", "set", nic, "name", "eth0")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "lo", "up")
            _ip("-n", node.netns, "link", "set", "eth0", "up")
            _ip("link", "set", core_port, "up")
            net.nodes[name] = node
        yield net
    finally:
        net.close()
