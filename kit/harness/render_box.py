"""A user's templates rendered in a child process bounded in time and memory.

Jinja's sandbox stops a template from running code, and :mod:`kit.harness.render` bounds
``*``, ``**`` and the text it renders; neither bounds time (nested loops over a long
string need no output, no call and no attribute) nor the memory one expression takes
(``"x".ljust(10**10)``, a ``{% set %}`` block, a macro's buffer). A child process can be
given both, as sandboxes of untrusted code are: ``RLIMIT_AS`` (:data:`MEMORY_LIMIT`; not
enforced by macOS, where only the time bound holds) and ``RLIMIT_CPU``, and a wall-clock
bound (:data:`TIME_LIMIT_S`) after which the server's side kills it.

The job crosses as JSON both ways (stdin, stdout): plain data, never code. The child
starts in ``/`` so that no ``kit/`` folder of the directory the user ran mlx-kit in is
imported (``-m`` puts the working directory first on ``sys.path``), with the folder of the
``kit`` this process runs first on its ``PYTHONPATH``, so it runs the same code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kit
from kit.errors import HarnessError

#: Seconds a user's templates may take to render, all of them together (one renders in
#: milliseconds; starting the child takes ~0.4 s on a loaded 2-core machine).
TIME_LIMIT_S = 10.0
#: Address space of the render child: Python with jinja2 maps ~60 MiB.
MEMORY_LIMIT = 512 * 2**20


def render_in_child(job: dict[str, Any]) -> dict[str, str]:
    """:func:`kit.harness.render.render_job` of ``job`` in a bounded child process.

    Raises:
        HarnessError: what ``render_job`` raises, or the templates took longer than
            :data:`TIME_LIMIT_S` or more memory than :data:`MEMORY_LIMIT`.
    """
    where = f"{job['name']}'s templates ({', '.join(t for _, t in job['files'])} in " \
            f"{job['templates']})"
    hint = "a config file's template renders a few KiB in milliseconds"
    # the kit this process runs, first: not whatever a relative PYTHONPATH finds from "/"
    here = str(Path(kit.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [here, *filter(None, [os.environ.get("PYTHONPATH")])])}
    # -c, not -m: -m puts the working directory ("/") first on sys.path, where a
    # container's /kit would be imported; here the first entry is this kit's folder
    boot = ("import runpy, sys; sys.path[0] = sys.argv[1]; "
            "runpy.run_module('kit.harness.render_child', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", boot, here], cwd="/",
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(json.dumps(job).encode(), timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise HarnessError(f"{where}: rendering took longer than {TIME_LIMIT_S:.0f} s; "
                           "stopped", hint=hint) from None
    try:
        answer = json.loads(out)
    except ValueError:  # killed by RLIMIT_CPU (SIGXCPU), or no memory left to answer
        raise HarnessError(f"{where}: rendering stopped (exit code {proc.returncode}): "
                           f"more than {TIME_LIMIT_S:.0f} s of CPU or "
                           f"{MEMORY_LIMIT // 2**20} MiB of memory", hint=hint) from None
    if "error" in answer:
        message, error_hint = answer["error"]
        raise HarnessError(message, hint=error_hint)
    return answer["files"]
