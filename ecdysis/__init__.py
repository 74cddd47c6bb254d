"""Ecdysis: evolve the runtime harness of LLM agents from batches of failures.

The engine (this package) never imports Streamlit and reaches persistence only through
`ecdysis.store.Store`; the UI and the CLI are two thin faces of `ecdysis.service.Service`.
"""

__version__ = "0.1.0"
