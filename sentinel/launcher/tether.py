"""`python -m sentinel.launcher.tether PARENT SIGNAL -- CMD…`: CMD, tied to the life of process PARENT.

It sets PR_SET_PDEATHSIG (which survives exec) and then execs CMD in its own place (same pid), so CMD gets
SIGNAL when PARENT ends, even by SIGKILL, when nothing is left to stop it. `sentinel demo` starts its
server, agents and launcher this way. Linux ties the signal to the parent *thread* that started the child:
start tethered processes from a thread that lives as long as the parent (the main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def tethered(argv: list[str], sig: int = signal.SIGTERM) -> list[str]:
    """`argv` run so that it gets `sig` when this process ends."""
    return [sys.executable, "-m", "sentinel.launcher.tether", str(os.getpid()), str(int(sig)), "--", *argv]


def main(args: list[str]) -> int:
    if len(args) < 4 or args[2] != "--":
        print("usage: python -m sentinel.launcher.tether PARENT SIGNAL -- CMD...", file=sys.stderr)
        return 2
    parent, sig, command = int(args[0]), int(args[1]), args[3:]
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the line above
        return 128 + sig
    os.execvp(command[0], command)
    return 127  # not reached: execvp raises when it cannot run the command


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
