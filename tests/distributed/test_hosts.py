"""kit.engine.distributed.hosts without a model: which ranks `serve`'s --ranks/--hosts/--hostfile/
--backend/--pipeline ask for (plan_world), and the mlx.launch command that starts them
(WorldPlan.command), read back by mlx.launch's own argument parser and host-list code.

The only stand-in: mlx.launch's launch_ring/launch_mpi/launch_nccl/launch_jaccl (which
would start processes) are replaced by a recorder, so the test sees what mlx.launch's real
``main()`` made of our command line (backend, hosts, env, port, the rank's command).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from kit.engine.distributed.hosts import BACKENDS, MAX_RANKS, WorldPlan, plan_world
from kit.errors import ConfigError


def plan(ranks=None, hosts=None, hostfile=None, backend=None, pipeline=False, timeout=300.0):
    return plan_world(ranks, hosts, hostfile, backend, pipeline, timeout)


# --- plan_world ------------------------------------------------------------------------------

def test_no_world_flag_or_one_local_rank_is_a_single_process():
    assert plan() is None
    assert plan(ranks=1) is None


def test_ranks_alone_puts_every_rank_on_loopback_over_ring():
    p = plan(ranks=3)
    assert (p.hosts, p.backend, p.mode, p.size, p.local, p.hostfile) == (
        ("127.0.0.1",) * 3, "ring", "tensor", 3, True, None)
    assert plan(ranks=2, pipeline=True, timeout=30).mode == "pipeline"
    assert plan(ranks=2, timeout=30).timeout == 30


def _this_ip() -> str:
    """An IPv4 address of this machine that is not loopback (skips when it has none)."""
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.skip("this machine has no address but loopback")


def test_ranks_with_hosts_is_the_total_each_host_running_its_share_in_order():
    me = _this_ip()
    p = plan(ranks=4, hosts=f"{me},10.0.0.2")
    assert p.hosts == (me, me, "10.0.0.2", "10.0.0.2")
    assert not p.local
    assert plan(hosts=f"{me},10.0.0.2").hosts == (me, "10.0.0.2")


def test_loopback_names_are_this_machine_even_for_ring():
    assert plan(hosts="localhost", ranks=2).hosts == ("127.0.0.1", "127.0.0.1")


def test_loopback_beside_other_hosts_is_refused():
    # the other hosts would be told to reach rank 0 at 127.0.0.1: their own loopback
    with pytest.raises(ConfigError, match="cannot be listed beside other hosts"):
        plan(hosts="localhost,10.0.0.2")


def test_a_host_listed_twice_apart_keeps_every_rank_in_mlx_launchs_order(launched):
    # the command once deduplicated the hosts: a,b,a planned 3 ranks and started 2
    me = _this_ip()
    p = plan(ranks=6, hosts=f"{me},10.0.0.2,{me}")
    assert p.hosts == (me, me, "10.0.0.2", "10.0.0.2", me, me)
    _, hosts, _, _ = launched(p.command(sys.executable, 32323, {}))
    assert tuple(h.ssh_hostname for h in hosts) == p.hosts


@pytest.mark.parametrize("kwargs", [{"ranks": 10 ** 9}, {"ranks": 10 ** 9, "hosts": "127.0.0.1"}])
def test_a_huge_rank_count_is_refused_before_anything_is_built(kwargs):
    with pytest.raises(ConfigError, match=f"between 1 and {MAX_RANKS}"):
        plan(**kwargs)


def test_host_names_that_would_reach_ssh_as_options_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="is not a host name or IP address"):
        plan(hosts="127.0.0.1,-oProxyCommand=x")
    f = write(tmp_path / "h.json", [{"ssh": "localhost"}, {"ssh": "-oProxyCommand=touch x"}])
    with pytest.raises(ConfigError, match="is not a host name or IP address"):
        plan(hostfile=f)


def test_a_host_file_that_is_not_a_small_regular_file_is_refused(tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a file"):
        plan(hostfile=str(fifo))  # reading a FIFO would wait for ever
    big = tmp_path / "big.json"
    big.write_text("[" + " " * (2 << 20) + "]")
    with pytest.raises(ConfigError, match="larger than"):
        plan(hostfile=str(big))


def test_one_rank_is_the_single_process_server():
    assert plan(ranks=1) is None
    assert plan(hosts="127.0.0.1") is None
    with pytest.raises(ConfigError, match="--pipeline needs 2 ranks"):
        plan(ranks=1, pipeline=True)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pipeline": True}, "--pipeline and --backend need --ranks, --hosts or --hostfile"),
    ({"backend": "ring"}, "--pipeline and --backend need --ranks, --hosts or --hostfile"),
    ({"ranks": 3, "backend": "foo"}, "--backend 'foo': one of ring, jaccl, mpi, nccl"),
    ({"ranks": 3, "hosts": "127.0.0.1,10.0.0.2"},
     "--ranks 3 is not a multiple of the 2 hosts"),
    ({"hosts": "127.0.0.1,,10.0.0.2"}, "a comma-separated list of hosts"),
    ({"hosts": "10.255.255.1,127.0.0.1"},
     "rank 0 would run on 10.255.255.1, not on this machine"),
    ({"hosts": "a,b"}, "--hosts a: the ring backend needs IP addresses, not host names"),
    ({"hosts": "127.0.0.1,b"}, "--hosts b: the ring backend needs IP addresses"),
    ({"ranks": MAX_RANKS + 1}, f"--ranks {MAX_RANKS + 1}: between 1 and {MAX_RANKS}"),
    ({"hosts": "127.0.0.1", "hostfile": "h.json"}, "give --hosts or --hostfile, not both"),
])
def test_a_world_that_cannot_start_is_a_config_error_naming_the_flag(kwargs, message):
    with pytest.raises(ConfigError) as got:
        plan(**kwargs)
    assert message in got.value.message


def test_host_names_are_fine_for_backends_that_resolve_them():
    this = socket.gethostname()
    p = plan(hosts=f"{this},other-mac", backend="jaccl")
    assert (p.hosts, p.backend) == ((this, "other-mac"), "jaccl")


# --- host files ------------------------------------------------------------------------------

def write(path: Path, data) -> str:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_a_host_file_lists_one_rank_per_entry_by_its_first_ip(tmp_path):
    f = write(tmp_path / "h.json", [{"ssh": "this", "ips": ["127.0.0.1", "10.1.0.1"]},
                                    {"ssh": "other", "ips": ["10.0.0.2"]},
                                    {"ssh": "third"}])
    p = plan(hostfile=f)
    assert (p.hosts, p.hostfile, p.backend) == (("127.0.0.1", "10.0.0.2", "third"),
                                                Path(f), "ring")


def test_a_host_file_of_mlx_distributed_config_gives_its_backend_unless_the_flag_does(
        tmp_path):
    f = write(tmp_path / "h.json", {"backend": "jaccl", "envs": ["MLX_METAL_FAST_SYNCH=1"],
                                    "hosts": [{"ssh": "localhost"}, {"ssh": "mac2"}]})
    assert plan(hostfile=f).backend == "jaccl"
    assert plan(hostfile=f, backend="ring").backend == "ring"
    assert plan(hostfile=f).hosts == ("127.0.0.1", "mac2")


@pytest.mark.parametrize(("content", "message"), [
    (None, "No such file or directory"),
    ("10.0.0.1 10.0.0.2\n", "not JSON"),
    ({"hosts": "10.0.0.1"}, "expected a list of {\"ssh\": NAME"),
    ([], "expected a list of {\"ssh\": NAME"),
    ([{"ips": ["10.0.0.1"]}], "expected a list of {\"ssh\": NAME"),
])
def test_a_bad_host_file_is_a_config_error_naming_it(tmp_path, content, message):
    path = tmp_path / "h.json"
    if content is not None:
        write(path, content)
    with pytest.raises(ConfigError) as got:
        plan(hostfile=str(path))
    assert got.value.message.startswith(f"--hostfile {path}: ")
    assert message in got.value.message


def test_ranks_must_match_the_host_file(tmp_path):
    f = write(tmp_path / "h.json", [{"ssh": "localhost"}, {"ssh": "10.0.0.2"}])
    assert plan(hostfile=f, ranks=2).size == 2
    with pytest.raises(ConfigError, match="--ranks 3 but .* lists 2 ranks"):
        plan(hostfile=f, ranks=3)


# --- WorldPlan.command, as mlx.launch reads it -----------------------------------------------

@pytest.fixture
def launched(monkeypatch):
    """Run mlx.launch's real ``main()`` on a command; its launchers record instead of
    starting processes. Returns a function: command -> (backend, hosts, args, rest)."""
    from mlx._distributed_utils import launch as mlx_launch

    seen = []
    for backend in ("ring", "mpi", "nccl", "jaccl"):
        monkeypatch.setattr(mlx_launch, f"launch_{backend}",
                            lambda parser, hosts, args, rest, b=backend: seen.append(
                                (b, hosts, args, rest)))

    def run(cmd: list[str]):
        python, dash_c, code, *argv = cmd
        assert (python, dash_c) == (sys.executable, "-c")
        assert "from mlx._distributed_utils.launch import main" in code
        monkeypatch.setattr(sys, "argv", ["mlx.launch", *argv])
        mlx_launch.main()
        assert len(seen) == 1
        return seen.pop()
    return run


def test_the_command_starts_every_rank_as_kit_engine_rank_over_ring(launched):
    p = plan(ranks=3)
    backend, hosts, args, rest = launched(p.command(sys.executable, 40000,
                                                    {"MLX_KIT_CONTROL": "/tmp/x"}))
    assert backend == "ring"
    assert [(h.rank, h.ssh_hostname, h.ips) for h in hosts] == [
        (r, "127.0.0.1", ["127.0.0.1"]) for r in range(3)]
    assert args.starting_port == 40000
    assert args.python == sys.executable
    assert "MLX_KIT_CONTROL=/tmp/x" in args.env
    assert rest == ["-m", "kit.engine.distributed.rank"]


def test_the_command_keeps_rank_order_over_hosts(launched):
    p = plan(ranks=4, hosts=f"{_this_ip()},10.0.0.2")
    _, hosts, _, _ = launched(p.command(sys.executable, 32323, {}))
    assert tuple(h.ssh_hostname for h in hosts) == p.hosts


def test_the_command_passes_the_host_file_and_its_backend(launched, tmp_path):
    f = write(tmp_path / "h.json", {"backend": "jaccl", "hosts": [{"ssh": "localhost"},
                                                                    {"ssh": "mac2"}]})
    p = plan(hostfile=f)
    backend, hosts, args, _ = launched(p.command(sys.executable, 0, {}))
    assert (backend, args.hostfile) == ("jaccl", f)
    assert [h.ssh_hostname for h in hosts] == ["localhost", "mac2"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_gets_its_port_flag(launched, backend):
    p = WorldPlan(backend, ("127.0.0.1", "127.0.0.1"), None, False, 300)
    got, _, args, _ = launched(p.command(sys.executable, 41000, {}))
    assert got == backend
    assert args.starting_port == (41000 if backend == "ring" else 32323)  # 32323: its default
    assert args.nccl_port == (41000 if backend == "nccl" else 12345)
