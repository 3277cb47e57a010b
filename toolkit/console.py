"""What reaches the console: the toolkit's own lines; what libraries print only with `--verbose`.

Libraries tell a user things the user cannot act on here: ModelOpt's "transformers X is not tested"
notice, deprecations inside torch / transformers / ModelOpt, ModelOpt's quantizer counts (print),
Hugging Face progress bars (which, in a log file, show once at 0 % and again at 100 %). Quiet mode
drops those; the toolkit's own errors and results are untouched.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings

THIRD_PARTY = r"(modelopt|torch|transformers|accelerate|huggingface_hub|safetensors|tritonclient)(\.|$)"
_verbose = False


def set_verbose(verbose: bool) -> None:
    """Called once by the CLI before any library is imported (the environment is read at import)."""
    global _verbose
    _verbose = verbose
    if verbose:
        return
    warnings.filterwarnings("ignore", module=THIRD_PARTY)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")  # libraries' bars; the sweep draws its own only on a terminal


@contextlib.contextmanager
def library_output():
    """Around a library call that prints progress with print(): keep it only with --verbose."""
    if _verbose:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield
