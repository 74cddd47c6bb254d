"""A small real world full of hostile text, for the tests that the pages render untrusted text
inertly (`test_app_inert.py`: AppTest and Chromium).

Every way text reaches the pages from outside the engine carries Markdown and HTML that would make
a browser fetch a URL or show a link: model replies, the error a harness raises, a model call's
error, a failed job's error, a reviewer's reason, a proposal's text and an imported suite's
category names. The URLs point at `BAIT_HOST`, a loopback address that is not the app's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ecdysis.errors import ModelError
from ecdysis.harness import new_version, starter_files
from ecdysis.models.registry import register_backend
from ecdysis.records import Completion, CompletionRequest, Instance, ScorerSpec, Suite
from ecdysis.service import RunRequest, Service
from ecdysis.diffs import diff_files
from ecdysis.store import JobRecord, ProposalRecord

BAIT_HOST = "127.0.0.2"
MODEL = "hostile-model"


def payload(port: int, tag: str) -> str:
    """Markdown image, HTML image, Markdown link, bare URL, www link, e-mail, icon shortcode,
    colour directive and an entity, each naming `tag` so a hit says which field leaked."""
    base = f"http://{BAIT_HOST}:{port}/{tag}"
    return (f"![img]({base}/md.png) <img src=\"{base}/html.png\"> [click]({base}/link) {base}/bare "
            f"www.{tag}.example.org mail-{tag}@example.org :material/home: :red[red] &lt;b&gt; "
            f"<a href=\"{base}/a\">a</a>")


class HostileBackend:
    """Replies with the payload; a message saying FAIL makes the call fail with the payload."""

    max_concurrency = 4
    deterministic = True

    def __init__(self, port: int) -> None:
        self.model_id = MODEL
        self.port = port

    def complete(self, request: CompletionRequest) -> Completion:
        last = request.messages[-1][1] if request.messages else ""
        if "FAIL" in last:
            raise ModelError(payload(self.port, "call-error"))
        return Completion(text=payload(self.port, "reply"), prompt_tokens=3, completion_tokens=3)

    def close(self) -> None:
        pass


HARNESS_PY = '''
def solve(task, model, harness):
    reply = model.generate([{"role": "user", "content": task["input"]}], max_tokens=64)
    if task["category"] == "fails":
        model.generate([{"role": "user", "content": "FAIL"}], max_tokens=8)
    raise ValueError(harness.params["error"] + " " + reply.text)
'''


@dataclass(frozen=True)
class HostileWorld:
    run_ids: list[str]
    diagnosis_id: str
    port: int


def build(svc: Service, port: int) -> HostileWorld:
    """Two runs (harness errors, then model-call errors), their diagnosis, a rejected proposal
    with a hostile reason, a failed job, all in `svc`'s store."""
    register_backend(HostileBackend(port))
    category = payload(port, "category").replace("\n", " ")
    suite = Suite(name="hostile-suite", scorer=ScorerSpec(kind="exact"), source="jsonl",
                  description=payload(port, "suite"),
                  instances=[Instance(id=f"i{n}", input=f"question {n}", target="42",
                                      category="fails" if n % 2 else category, split=split)
                             for n, split in enumerate(["train"] * 6 + ["validation"] * 2)])
    svc.store.save_suite(suite)
    files = starter_files()
    files["harness.py"] = HARNESS_PY
    files["harness.toml"] += f'error = """{payload(port, "harness-error")}"""\n'
    version = svc.store.put_harness(new_version(files, parent=None, note=payload(port, "note"), status="imported"))
    run_ids = [svc.run(RunRequest(suite=suite.name, model=MODEL, harness=version.id, limit=6)).run_id]
    rec = svc.diagnose(run_ids)
    # Proposals as LLM roles could write them: every text field is the model's.
    for n in (1, 2):
        text = payload(port, f"proposal{n}")
        patched = {"harness.py": HARNESS_PY + f"# {text}\n"}
        spec = {key: text for key in ("change", "root_cause", "expected_effect", "risk", "scope")}
        svc.store.save_proposal(ProposalRecord(
            id=f"phostile{n}", diagnosis_id=rec.id, cluster_id="c1", harness_version=version.id,
            spec={**spec, "target_files": ["harness.py"], "operator": text, "exemplars": [text]},
            files=patched, created_at=time.time(),
            data={"diffs": [d.to_json() for d in diff_files(files, {**files, **patched})],
                  "checks": [{"name": text, "ok": False, "detail": text}], "objections": [text], "reason": text}))
    svc.decide("phostile1", "reject", who=payload(port, "who"), reason=payload(port, "reason"))
    now = time.time()
    svc.store.create_job(JobRecord(id="jhostile", kind="run", status="failed", error=payload(port, "job-error"),
                                   created_at=now, updated_at=now))
    return HostileWorld(run_ids=run_ids, diagnosis_id=rec.id, port=port)
