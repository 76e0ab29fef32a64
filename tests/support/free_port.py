"""A TCP port of 127.0.0.1 for a test's rendezvous (UCX, verl's and Ray's
stores), printed when run as a script (tests/ucx/run_ucx.sh).

Not the kernel's bind-to-0 choice: that port lies in the ephemeral range,
and once released any process's outgoing connection may take it as its
source port before the test's listener binds it again (seen as UCX's
"Address already in use" with tests running in parallel, each opening
TCP connections). A port below the ephemeral range is never handed out
that way; it is picked at random and checked free, so that tests running
at once rarely meet."""
import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    low = _ephemeral_low()
    top = low - 1 if low > 12000 else 65535
    base = 10000 if low > 12000 else 61000
    for _ in range(200):
        port = random.randint(base, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything tried is taken: the kernel's
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    print(free_port())
