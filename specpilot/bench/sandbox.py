"""Run untrusted Python (a model's code answer plus its tests) in a sandboxed subprocess.

Layers, each enough to stop the obvious and together a reasonable sanity-check sandbox:
- a fresh temp dir as cwd, HOME and TMPDIR; an environment with nothing inherited (no
  API keys); `python -I -S` (no site-packages, no user paths);
- resource limits: CPU seconds, address space, file size, no core dumps; a wall-clock
  timeout after which the whole process group is killed;
- no network: a new, empty network namespace (`unshare -rn`) where the kernel allows it;
- an audit hook installed before the code runs that refuses writes outside the temp dir,
  sockets, subprocesses, fork/exec and ctypes, whether or not namespaces are available.
It is not a security boundary against a determined attacker (use a VM for that); it keeps
a wrong or runaway answer from hurting the machine the bench runs on.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

BOOT = r'''
import os, sys
ROOT = os.path.realpath(sys.argv[1])
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
def inside(p):
    if isinstance(p, int):
        return True
    try:
        p = os.path.realpath(os.fsdecode(p))
    except Exception:
        return False
    return p == ROOT or p.startswith(ROOT + os.sep) or p == "/dev/null"
PATHS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
         "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,),
         "os.chown": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,),
         "shutil.copytree": (1,), "shutil.move": (0, 1), "os.mkfifo": (0,), "os.mknod": (0,)}
BANNED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
          "os.fork", "os.forkpty", "os.kill", "os.killpg", "ctypes.", "pty.", "os.startfile",
          "_posixsubprocess", "sys.remote_exec")
def hook(event, args):
    if event == "open":
        path, mode, flags = (list(args) + [None, None])[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & WRITE)
        if writes and not inside(path):
            raise PermissionError(f"sandbox: no writing outside its directory ({path})")
    elif event in PATHS:
        for i in PATHS[event]:
            if i < len(args) and not inside(args[i]):
                raise PermissionError(f"sandbox: {event} outside its directory")
    elif event.startswith(BANNED):
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(hook)
del hook
import runpy
sys.argv = ["main.py"]
runpy.run_path(os.path.join(ROOT, "main.py"), run_name="__main__")
'''


@dataclass
class SandboxResult:
    ok: bool  # exited 0 within the limits
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    isolation: str  # "netns+audit" or "audit"


@functools.cache
def netns_available() -> bool:
    """Whether `unshare -rn` can make an unprivileged network namespace here."""
    exe = shutil.which("unshare")
    if not exe:
        return False
    try:
        return subprocess.run(check=False, args=[exe, "-rn", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limits(cpu_s: int, memory_mb: int, file_mb: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        mem = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        f = file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (f, f))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_python(code: str, timeout: float = 10.0, memory_mb: int = 512, cpu_s: int | None = None,
               file_mb: int = 16) -> SandboxResult:
    """Run `code` as a script in a fresh sandbox directory; the directory is removed after."""
    tmp = tempfile.mkdtemp(prefix="specpilot-sandbox-")
    try:
        with open(os.path.join(tmp, "main.py"), "w") as f:
            f.write(code)
        env = {"HOME": tmp, "TMPDIR": tmp, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        cmd = [sys.executable, "-I", "-S", "-c", BOOT, tmp]
        netns = netns_available()
        if netns:
            cmd = [shutil.which("unshare"), "-rn", *cmd]
        cpu = cpu_s if cpu_s is not None else max(1, int(timeout))
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True,
                                preexec_fn=_limits(cpu, memory_mb, file_mb))  # noqa: PLW1509
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        rc = proc.returncode
        # The CPU-time limit (SIGXCPU, then SIGKILL at the hard limit) is a time-out too: on
        # an idle machine a busy loop reaches it about when the wall clock does.
        timed_out = timed_out or rc in (-signal.SIGXCPU, -signal.SIGKILL)
        return SandboxResult(ok=rc == 0 and not timed_out, returncode=rc, timed_out=timed_out,
                             stdout=out[-4000:], stderr=err[-4000:],
                             isolation="netns+audit" if netns else "audit")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
