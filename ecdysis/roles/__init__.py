"""The roles of Failure-Driven Collaborative Refinement (Investigator, Attributor, Proposer,
Critic) behind one `RoleBackend` seam, with a heuristic and an LLM backend."""

from __future__ import annotations

from typing import Callable, cast

from ecdysis.budget import CallBudget
from ecdysis.models.base import ModelBackend
from ecdysis.roles.base import ROLES, CaseFile, RoleBackend, RoleMessage, RoleTurn
from ecdysis.roles.heuristic import HeuristicRoleBackend
from ecdysis.store import Store

__all__ = ["ROLES", "CaseFile", "HeuristicRoleBackend", "RoleBackend", "RoleMessage", "RoleTurn",
           "make_role_backend"]


def make_role_backend(spec: str | RoleBackend | ModelBackend, *, store: Store | None = None,
                      backend_factory: Callable[[str], ModelBackend] | None = None,
                      budget: CallBudget | None = None) -> RoleBackend:
    """`"heuristic"`, a model name (any name the model registry knows), a model backend (played
    by the LLM role backend), or a ready role backend. `budget` is charged for every role call."""
    if isinstance(spec, str):
        if spec in ("", "heuristic"):
            return HeuristicRoleBackend()
        from ecdysis.models.registry import get_backend
        return _llm_roles((backend_factory or get_backend)(spec), store, budget)
    if hasattr(spec, "complete"):  # a model backend: the LLM role backend plays the roles on it
        return _llm_roles(cast(ModelBackend, spec), store, budget)
    return cast(RoleBackend, spec)


def _llm_roles(backend: ModelBackend, store: Store | None, budget: CallBudget | None) -> RoleBackend:
    from ecdysis.models.registry import LOCAL_NAMES
    from ecdysis.roles.llm import LLMRoleBackend
    if backend.model_id in LOCAL_NAMES:
        # An embedded model reads the prompt at a few hundred tokens a second on 2 cores: show it
        # less of each harness file, and let it write less.
        return LLMRoleBackend(backend, store=store, file_chars=3000, max_tokens=768, budget=budget)
    return LLMRoleBackend(backend, store=store, budget=budget)
