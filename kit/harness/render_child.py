"""The child :func:`kit.harness.render_box.render_in_child` starts: it bounds itself
(:data:`~kit.harness.render_box.MEMORY_LIMIT`, :data:`~kit.harness.render_box.TIME_LIMIT_S`),
reads the job from stdin, renders it and writes the answer to stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kit.errors import HarnessError
from kit.harness.render import render_job
from kit.harness.render_box import MEMORY_LIMIT, TIME_LIMIT_S


def _main() -> None:
    """The child: bound itself, read the job from stdin, write the answer to stdout."""
    import resource

    for limit, value in ((resource.RLIMIT_AS, MEMORY_LIMIT),
                         (resource.RLIMIT_CPU, int(TIME_LIMIT_S) + 1)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):  # macOS refuses RLIMIT_AS: the time bound holds
            pass
    job = json.loads(sys.stdin.buffer.read())
    try:
        answer: dict[str, Any] = {"files": render_job(job)}
    except HarnessError as e:
        answer = {"error": [e.message, e.hint]}
    except MemoryError:
        answer = {"error": [f"{job['name']}'s templates ({job['templates']}): rendering "
                            f"needs more than {MEMORY_LIMIT // 2**20} MiB of memory",
                            "a config file's template renders a few KiB"]}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    _main()
