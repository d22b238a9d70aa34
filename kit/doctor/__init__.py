"""``mlx-kit doctor``'s checks: everything that decides whether ``mlx-kit launch`` works,
each as a :class:`~kit.doctor.check.Check` (ok / warn / fail, a one-line fix).

One module per area: :mod:`.system` (Python, mlx, BLAS), :mod:`.server` (the server,
its port, its API key), :mod:`.proxy` (proxy variables), :mod:`.cache` (the Hugging Face
cache, the starter), :mod:`.agents` (each agent's binary, version and config);
:mod:`.run` runs them all at once, each bounded in time.
"""
