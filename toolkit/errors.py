"""User-facing errors: one line that names the problem and the fix, no traceback."""


class ToolkitError(Exception):
    """An error the user can fix. The CLI prints `error: <message>` and exits non-zero."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} — {fix}" if fix else problem)


def missing_dependency(what: str, how: str) -> ToolkitError:
    """The one-line error for an optional GPU-side dependency (TensorRT-LLM, CUDA) that is absent."""
    return ToolkitError(f"{what} is not installed here", how)
