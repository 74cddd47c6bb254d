"""A proposal's life in one place: the statuses it can have and the moves between them.

    pending ──decision──> approved | edited | rejected          (the human gate, `gate.decide`)
    approved | edited ──composition──> applied | superseded     (a harness version is built)
    applied | superseded ──a later composition──> applied | superseded   (a resumed or rescreened
                                                                          iteration composes again)

A rejected proposal stays rejected. The Critic's own verdict is not a status here: the roles store
a proposal the Critic endorsed as `pending` (waiting for a person) and one it rejected as
`rejected`, with the reason in its transcript. Every status change goes through `move`, which
refuses a move the table does not allow; deciding (which also writes the decision) goes through
the store's conditional `decide_proposal`, with `DECIDED` naming the status each decision gives.
"""

from __future__ import annotations

from typing import Literal

from ecdysis.errors import Conflict, NotFound
from ecdysis.store import Store

ProposalStatus = Literal["pending", "approved", "edited", "rejected", "applied", "superseded"]
STATUSES: tuple[ProposalStatus, ...] = ("pending", "approved", "edited", "rejected", "applied", "superseded")
DECIDED: dict[str, ProposalStatus] = {"approve": "approved", "edit": "edited", "reject": "rejected"}
# Statuses whose files a composition may apply (a person approved them, as proposed or edited).
COMPOSABLE: tuple[ProposalStatus, ...] = ("approved", "edited", "applied", "superseded")
MOVES: dict[str, frozenset[str]] = {
    "pending": frozenset({"approved", "edited", "rejected"}),
    "approved": frozenset({"applied", "superseded"}),
    "edited": frozenset({"applied", "superseded"}),
    "applied": frozenset({"applied", "superseded"}),
    "superseded": frozenset({"applied", "superseded"}),
    "rejected": frozenset(),
}


def can_move(current: str, to: str) -> bool:
    return to in MOVES.get(current, frozenset())


def move(store: Store, proposal_id: str, to: ProposalStatus) -> None:
    """Set the proposal's status to `to`, or raise `Conflict` (nothing written) when its status
    now does not allow that move."""
    proposal = store.get_proposal(proposal_id)
    if proposal is None:
        raise NotFound(f"no proposal {proposal_id!r}")
    if not can_move(proposal.status, to):
        raise Conflict(f"proposal {proposal_id} is {proposal.status}; it cannot become {to}",
                       hint="a proposal is decided once; only approved or edited ones are applied")
    store.set_proposal_status(proposal_id, to)
