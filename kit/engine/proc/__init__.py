"""The process boundary: :class:`~kit.engine.proc.process.EngineProcess` is the same
interface as the in-process engine over a pipe to a child process (``child``: the child's
end), restarted when it dies. The server's HTTP process imports this, never mlx.
"""
