"""Which backend wrote what: an LLM role backend on an embedded model gets short prompts, and the
Clusters page's summary of a report counts the role outputs by the backend that produced them
(an LLM that fell back to the heuristic says so)."""

from __future__ import annotations

from app import views
from ecdysis.diagnosis import DiagnosisReport
from ecdysis.models.registry import get_backend
from ecdysis.roles import make_role_backend
from ecdysis.roles.llm import LLMRoleBackend


def out(backend: str) -> dict[str, object]:
    return {"round": 1, "role": "critic", "kind": "output", "backend": backend, "text": "", "data": None}


def test_output_backends_counts_llm_and_fallback_outputs() -> None:
    proposal = {"id": "p1", "cluster_id": "c1", "status": "endorsed", "spec": {}, "diffs": [], "base_harness": "h",
                "rounds": 1, "transcript": [out("llm:qwen2.5-coder-1.5b"), out("llm:qwen2.5-coder-1.5b"),
                                            {**out("llm:qwen2.5-coder-1.5b"), "kind": "reply"}]}
    report = DiagnosisReport.from_json({
        "id": "d1", "proposals": [proposal],
        "clusters": [{"id": "c1"}, {"id": "c2", "patch": {"transcript": [out("heuristic (fallback)"),
                                                                          out("llm:qwen2.5-coder-1.5b")]}},
                     {"id": "c3"}]})
    assert views.output_backends(report) == "3 from llm:qwen2.5-coder-1.5b, 1 from heuristic (fallback)"
    assert views.output_backends(DiagnosisReport.from_json({"id": "d2"})) == ""


def test_embedded_role_models_get_shorter_prompts_than_remote_ones() -> None:
    roles = make_role_backend("qwen2.5-coder-1.5b")
    assert isinstance(roles, LLMRoleBackend) and roles.structured
    assert roles.file_chars == 3000 and roles.max_tokens == 768
    assert roles.gateway.backend is get_backend("qwen2.5-coder-1.5b")
    assert make_role_backend("heuristic").name == "heuristic"
