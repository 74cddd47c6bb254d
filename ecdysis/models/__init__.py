"""Model backends behind one protocol (`base.ModelBackend`), resolved by name in `registry`."""

from ecdysis.models.base import ModelBackend
from ecdysis.models.gateway import ModelGateway
from ecdysis.models.registry import create_backend, get_backend, register_backend

__all__ = ["ModelBackend", "ModelGateway", "create_backend", "get_backend", "register_backend"]
