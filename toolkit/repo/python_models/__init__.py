"""Code that runs inside Triton's python backend process. It imports only what the venv on PATH
has (torch, transformers, numpy, triton_python_backend_utils) — never the rest of the toolkit."""
