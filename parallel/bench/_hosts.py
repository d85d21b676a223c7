"""Two hosts on one machine: two network namespaces joined by a veth pair, so that MPI's
bytes cross a real (optionally rate-shaped) network link instead of shared memory.

    with TwoHosts(rate="100mbit") as hosts:           # root only: can_make_hosts() says why not
        run = hosts.mpiexec(["-m", "parallel.train", "--dp", "2"], timeout=120)
        hosts.bytes_sent()                            # the link's byte counters, both ways
        hosts.cut(); hosts.restore()                  # the cable out, and back

Each host is a namespace holding one end of the veth, named `mt0` on both sides, with a
private address (10.213.X.1 and .2, X from the process id) that exists only inside the
namespaces made here: no other interface is touched, and leaving the block kills what still
runs in them and deletes them (and with them the veth), whatever happened inside.

How MPICH runs across them (what the README's multi-host section says, found here):
  - Hydra's mpiexec runs in host A and starts one proxy per host through an ssh stand-in
    (`-launcher ssh -launcher-exec WRAPPER`) that runs the command in the namespace owning
    the host's address; `-iface mt0` wires the job over the veth.
  - The data path crosses the veth only with MPIR_CVAR_CH4_NETMOD=ofi and FI_PROVIDER=tcp:
    the default UCX netmod used shared memory between the namespaces, and ofi without a
    provider picked `sockets`. FI_TCP_IFACE names the interface, the same on both hosts.
  - `tc` shapes the link's rate (a token bucket on each end's egress); this kernel has no
    netem, so no added latency.
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ..launch import find_mpiexec

IFACE = "mt0"
MPI_OVER_TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": IFACE}
REPO = Path(__file__).resolve().parents[2]


def can_make_hosts():
    """None if this process can make the two hosts, else the reason it cannot."""
    if os.geteuid() != 0:
        return "making network namespaces needs root (this process is not)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if find_mpiexec() is None:
        return "no mpiexec next to this Python or on PATH"
    probe = f"mt{os.getpid() % 100000}probe"  # root in a container may still lack CAP_NET_ADMIN
    made = sh("ip", "netns", "add", probe, check=False)
    sh("ip", "netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here ({made.stderr.strip() or made.returncode})"
    return None


def sh(*command, check=True):
    return subprocess.run(command, capture_output=True, text=True, check=check)


class TwoHosts:
    """Hosts A and B (namespaces) joined by a veth, optionally shaped to `rate` (tc syntax: "100mbit")."""

    def __init__(self, rate=None):
        tag = os.getpid() % 100000
        self.names = (f"mt{tag}a", f"mt{tag}b")
        subnet = f"10.213.{tag % 250}"
        self.addresses = (f"{subnet}.1", f"{subnet}.2")
        self.rate = rate
        self.scratch = None

    def __enter__(self):
        problem = can_make_hosts()
        if problem:
            raise RuntimeError(f"TwoHosts: {problem}")
        self.scratch = Path(tempfile.mkdtemp(prefix="two-hosts-"))
        try:
            self.make()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def make(self):
        a, b = self.names
        for name in self.names:
            sh("ip", "netns", "add", name)
        sh("ip", "link", "add", f"{a}v", "type", "veth", "peer", "name", f"{b}v")
        for name, address in zip(self.names, self.addresses):
            sh("ip", "link", "set", f"{name}v", "netns", name)
            sh("ip", "-n", name, "link", "set", f"{name}v", "name", IFACE)
            sh("ip", "-n", name, "addr", "add", f"{address}/24", "dev", IFACE)
            sh("ip", "-n", name, "link", "set", "lo", "up")
            sh("ip", "-n", name, "link", "set", IFACE, "up")
        if self.rate:
            self.shape(self.rate)
        self.wrapper = self.write_wrapper()

    def shape(self, rate):
        """Limit each end's egress to `rate` with a token bucket (burst: 4 ms at that rate, ≥ 32 KiB)."""
        bits = float(rate.lower().replace("gbit", "e9").replace("mbit", "e6").replace("kbit", "e3"))
        burst = max(32 * 1024, int(bits / 8 * 0.004))
        for name in self.names:
            sh("ip", "netns", "exec", name, "tc", "qdisc", "replace", "dev", IFACE, "root", "tbf", "rate", rate,
               "burst", str(burst), "latency", "100ms")
        self.rate = rate

    def write_wrapper(self):
        """The ssh stand-in Hydra calls as `WRAPPER [options] HOST COMMAND`: it runs COMMAND in HOST's namespace."""
        cases = "\n".join(f'  {address}) ns={name} ;;' for name, address in zip(self.names, self.addresses))
        script = self.scratch / "ssh-into-namespace"
        script.write_text(f'#!/bin/sh\nwhile [ "${{1#-}}" != "$1" ]; do shift; done\nhost="$1"; shift\n'
                          f'case "$host" in\n{cases}\n  *) echo "no host $host" >&2; exit 255 ;;\nesac\n'
                          f'exec ip netns exec "$ns" sh -c "$*"\n')
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        return script

    def mpiexec_command(self, args, ranks_per_host=1):
        """The launch line: mpiexec in host A, `ranks_per_host` ranks on each host, `python args...`."""
        env = {**MPI_OVER_TCP, "OPENBLAS_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
        return (["ip", "netns", "exec", self.names[0], "env", *(f"{k}={v}" for k, v in env.items()),
                 find_mpiexec(), "-hosts", ",".join(self.addresses), "-launcher", "ssh", "-launcher-exec",
                 str(self.wrapper), "-iface", IFACE, "-ppn", str(ranks_per_host), "-n", str(2 * ranks_per_host),
                 sys.executable, *map(str, args)])

    def mpiexec(self, args, timeout, ranks_per_host=1):
        """Run the job across the hosts; the CompletedProcess (stdout, stderr as text)."""
        return subprocess.run(self.mpiexec_command(args, ranks_per_host), capture_output=True, text=True,
                              timeout=timeout)

    def start(self, args, ranks_per_host=1):
        """Start the job across the hosts without waiting: the Popen."""
        return subprocess.Popen(self.mpiexec_command(args, ranks_per_host), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def bytes_sent(self):
        """{host: bytes its end of the link has sent} (the interface's counters)."""
        sent = {}
        for name in self.names:
            link = json.loads(sh("ip", "-n", name, "-s", "-j", "link", "show", "dev", IFACE).stdout)[0]
            sent[name] = link["stats64"]["tx"]["bytes"]
        return sent

    def cut(self):
        """Pull the cable: host B's end goes down (and with it the carrier on A's)."""
        sh("ip", "-n", self.names[1], "link", "set", IFACE, "down")

    def restore(self):
        sh("ip", "-n", self.names[1], "link", "set", IFACE, "up")

    def remove(self):
        """Kill what runs in the namespaces, delete them (the veth goes with them) and the scratch files."""
        for name in self.names:
            pids = sh("ip", "netns", "pids", name, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
