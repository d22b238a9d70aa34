"""Which ranks a distributed engine runs and how ``mlx.launch`` starts them, from
``serve``'s ``--ranks`` / ``--hosts`` / ``--hostfile`` / ``--backend`` / ``--pipeline``.
Pure Python (the HTTP process never imports mlx): :func:`plan_world` checks the flags and
:meth:`WorldPlan.command` writes the ``mlx.launch`` command line.

Host files are ``mlx.launch``'s JSON format (``mlx.distributed_config`` writes them): a
list of ``{"ssh": NAME, "ips": [IP, ...]}`` or ``{"backend": ..., "envs": [...], "hosts":
[...]}``; each entry is one rank.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from kit.errors import ConfigError, ServerError
from kit.models.split import MAX_RANKS

BACKENDS = ("ring", "jaccl", "mpi", "nccl")
#: exit status of a rank that lost a peer or timed out waiting for one (kit/engine/distributed/world.py);
#: the server names the rank that exited first with another status as the one that failed
EXIT_PEER_LOST = 75
#: exit status of a rank that refused what crossed the ring (a share that failed its MAC,
#: a rank that could not prove the world's secret, a ring link to another user's socket)
EXIT_TAMPERED = 77
_MAX_HOSTFILE = 1 << 20  # bytes; mlx.distributed_config writes a few hundred per host
_MAX_HOSTS_TEXT = 64 * 256
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:%-]{0,252}")  # a name, IPv4 or IPv6
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_this_machine(host: str) -> bool:
    """Whether ``host`` (a name or an IP) names this machine: loopback, its host name,
    or an address of one of its interfaces (``psutil.net_if_addrs``)."""
    if host in _LOCAL_NAMES or host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        return False
    import psutil

    return any(a.address.split("%")[0] == host
               for addrs in psutil.net_if_addrs().values() for a in addrs)


@dataclass(frozen=True)
class WorldPlan:
    """The ranks to start.

    Attributes:
        backend: ``ring``, ``jaccl``, ``mpi`` or ``nccl``.
        hosts: each rank's host (rank order; rank 0 is this machine).
        hostfile: the user's host file (then ``mlx.launch`` reads it), or None.
        pipeline: pipeline parallelism (layers split over ranks) instead of tensor
            parallelism (each layer's heads and MLP split over ranks).
        timeout: seconds a rank may wait for the others before it gives up.
        repeat: ranks per host entry (``hosts`` lists each entry that many times in a
            row, as ``mlx.launch -n`` repeats them).
    """

    backend: str
    hosts: tuple[str, ...]
    hostfile: Path | None
    pipeline: bool
    timeout: float
    repeat: int = 1

    @property
    def size(self) -> int:
        """The world size (ranks)."""
        return len(self.hosts)

    @property
    def mode(self) -> str:
        """``tensor`` or ``pipeline``."""
        return "pipeline" if self.pipeline else "tensor"

    @property
    def local(self) -> bool:
        """Whether every rank runs on this machine (over loopback)."""
        return all(h == "127.0.0.1" for h in self.hosts)

    def command(self, python: str, port: int, env: dict[str, str]) -> list[str]:
        """The ``mlx.launch`` command line that starts every rank as ``python -m
        kit.engine.distributed.rank`` (``port``: the ring backend's first port; ``env``: variables
        every rank gets, remote ones too)."""
        cmd = [python, "-c", "import sys; from mlx._distributed_utils.launch import main; "
               "sys.argv[0] = 'mlx.launch'; sys.exit(main())",
               "--backend", self.backend, "--python", python]
        if self.hostfile is not None:
            cmd += ["--hostfile", str(self.hostfile)]
        else:
            cmd += ["--hosts", ",".join(self.hosts[::self.repeat]), "-n", str(self.repeat)]
        if self.backend == "ring":
            cmd += ["--starting-port", str(port)]
        elif self.backend == "nccl":
            cmd += ["--nccl-port", str(port)]
        for key, value in env.items():
            cmd += ["--env", f"{key}={value}"]
        return [*cmd, "--", "-m", "kit.engine.distributed.rank"]


def _hostfile_hosts(path: Path) -> tuple[list[str], str]:
    """Each rank's host in ``path`` (its first IP, else its ssh name) and the backend it
    names ("" when none).

    Raises:
        ConfigError: the file is missing, not JSON, or not mlx.launch's format.
    """
    try:
        if path.exists() and not path.is_file():  # a FIFO or a device: reading must end
            raise ConfigError(f"--hostfile {path}: not a file")
        with open(path, "rb") as f:
            text = f.read(_MAX_HOSTFILE + 1)
        if len(text) > _MAX_HOSTFILE:
            raise ConfigError(f"--hostfile {path}: larger than {_MAX_HOSTFILE // 1024} KiB")
        data = json.loads(text)
    except OSError as e:
        raise ConfigError(f"--hostfile {path}: {e.strerror}") from None
    except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's limit
        raise ConfigError(f"--hostfile {path}: not JSON ({str(e)[:200]})") from None
    backend: object = ""
    if isinstance(data, dict):
        backend = data.get("backend") or ""
        data = data.get("hosts")
    if not isinstance(data, list) or not data or not all(
            isinstance(h, dict) and isinstance(h.get("ssh"), str) for h in data):
        raise ConfigError(f"--hostfile {path}: expected a list of {{\"ssh\": NAME, \"ips\": "
                          "[IP, ...]}} entries (or {\"hosts\": [...]})",
                          hint="mlx.distributed_config writes one")
    if len(data) > MAX_RANKS:
        raise ConfigError(f"--hostfile {path}: {len(data)} ranks, at most {MAX_RANKS}")
    hosts = []
    for h in data:
        ips = h.get("ips") if isinstance(h.get("ips"), list) else []
        for value in [h["ssh"], *ips]:
            _check_host(value, f"--hostfile {path}")
        hosts.append(ips[0] if ips else h["ssh"])
    if not isinstance(backend, str) or backend not in ("", *BACKENDS, "jaccl-ring"):
        raise ConfigError(f"--hostfile {path}: backend {str(backend)[:40]!r}: one of "
                          f"{', '.join(BACKENDS)}, jaccl-ring")
    return hosts, backend


def _check_host(value: object, where: str) -> str:
    """``value`` when it is a host name or IP address (no option-like or shell text: it
    reaches ssh's command line).

    Raises:
        ConfigError: it is not.
    """
    if not isinstance(value, str) or not _HOST.fullmatch(value):
        raise ConfigError(f"{where}: {str(value)[:60]!r} is not a host name or IP address")
    return value


def plan_world(ranks: int | None, hosts: str | None, hostfile: str | None,
               backend: str | None, pipeline: bool, timeout: float) -> WorldPlan | None:
    """The ranks ``serve``'s flags ask for; None for a single process (no flag given,
    or ``--ranks 1`` alone).

    Raises:
        ConfigError: flags that contradict each other, a rank count that is not
            possible, rank 0 not on this machine, an unknown backend, a bad host file.
    """
    if ranks is None and hosts is None and hostfile is None:
        if pipeline or backend:
            raise ConfigError("--pipeline and --backend need --ranks, --hosts or --hostfile")
        return None
    if hosts is not None and hostfile is not None:
        raise ConfigError("give --hosts or --hostfile, not both")
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: one of {', '.join(BACKENDS)}")
    path = None
    if hostfile is not None:
        path = Path(hostfile).expanduser()
        listed, file_backend = _hostfile_hosts(path)
        backend = backend or file_backend or None
        if ranks is not None and ranks != len(listed):
            raise ConfigError(f"--ranks {ranks} but {path} lists {len(listed)} ranks",
                              hint="each host file entry is one rank; drop --ranks")
        every = listed
    elif hosts is not None:
        names = [h.strip() for h in hosts[:_MAX_HOSTS_TEXT].split(",")]
        if len(hosts) > _MAX_HOSTS_TEXT or not names or any(not h for h in names):
            raise ConfigError(f"--hosts {hosts[:60]!r}: a comma-separated list of hosts",
                              hint="e.g. --hosts 10.0.0.1,10.0.0.2")
        for h in names:
            _check_host(h, "--hosts")
        n = ranks or len(names)
        if n > MAX_RANKS:
            raise ConfigError(f"--ranks {n}: between 1 and {MAX_RANKS}")
        if n % len(names):
            raise ConfigError(f"--ranks {n} is not a multiple of the {len(names)} hosts",
                              hint="--ranks is the total; each host runs the same count")
        repeat = n // len(names)
        every = [h for h in names for _ in range(repeat)]
    else:
        if ranks > MAX_RANKS:
            raise ConfigError(f"--ranks {ranks}: between 1 and {MAX_RANKS}")
        every, repeat = ["127.0.0.1"] * ranks, ranks
    if not 1 <= len(every) <= MAX_RANKS:
        raise ConfigError(f"--ranks {len(every)}: between 1 and {MAX_RANKS}")
    if path is not None:
        repeat = 1
    if len(every) == 1:  # one rank is the single-process server
        if pipeline:
            raise ConfigError("--pipeline needs 2 ranks or more")
        if not is_this_machine(every[0]):
            raise ConfigError(f"rank 0 would run on {every[0]}, not on this machine: rank 0 "
                              "answers HTTP here", hint="list this machine first")
        return None
    backend = backend or "ring"
    # loopback names first (localhost is this machine, also for ring); then names before
    # rank 0's place: `--hosts a,b` is a list ring cannot use, whichever machine a is
    every = ["127.0.0.1" if h in _LOCAL_NAMES else h for h in every]
    if backend == "ring" and path is None:
        for h in dict.fromkeys(every):
            try:
                ipaddress.ip_address(h)
            except ValueError:
                raise ConfigError(f"--hosts {h}: the ring backend needs IP addresses, not "
                                  "host names", hint="use IPs, or a --hostfile with "
                                  "\"ips\" (mlx.distributed_config writes one)") from None
    if not is_this_machine(every[0]):
        raise ConfigError(f"rank 0 would run on {every[0]}, not on this machine: rank 0 "
                          "answers HTTP here", hint="list this machine first")
    if path is None and "127.0.0.1" in every and any(h != "127.0.0.1" for h in every):
        raise ConfigError("127.0.0.1 (or localhost) cannot be listed beside other hosts: "
                          "they would look for rank 0 at their own loopback address",
                          hint="list this machine by its address on the network the hosts "
                               "share")
    return WorldPlan(backend, tuple(every), path, pipeline, timeout, repeat)


def python_for_ranks() -> str:
    """The interpreter every rank runs (the same path on every host: install mlx-kit in
    the same virtual environment path on each)."""
    return sys.executable


_RING_PORTS = (10000, 32768)  # where free_ring_ports draws: below Linux's ephemeral range,
# where a port free now can be any outgoing connection's a moment later


def _ring_range() -> tuple[int, int]:
    low, high = _RING_PORTS
    try:  # a machine whose ephemeral range starts lower
        first = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
        high = max(low + 1000, min(high, first))
    except (OSError, ValueError, IndexError):
        pass
    return low, high


def free_ring_ports(count: int) -> int:
    """A first port of ``count`` consecutive free TCP ports on loopback (the ring backend
    listens on one per rank), drawn at random (``secrets``) below the ephemeral range,
    so no other user can tell it before ``mlx.launch``'s command line shows it (the
    kernel's own pick, ``bind(0)``, follows a sequence others can sample) and no
    outgoing connection takes it meanwhile.

    Raises:
        ServerError: no free run of ports in 50 draws.
    """
    low, high = _ring_range()
    for _ in range(50):
        base = low + secrets.randbelow(high - low - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise ServerError("no free ports for the ring backend")
