"""Launching 2-process tests: a free rendezvous port for each, so that the two test runs of
`scripts/test.sh` (side by side) never collide on torchrun's default port."""

import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_port_args() -> list[str]:
    return ["--main_process_port", str(free_port())]


def torchrun_port_args() -> list[str]:
    return ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
