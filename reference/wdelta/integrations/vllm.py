"""vLLM: the ``wdelta`` weight-transfer backend, and the trainer's one-call update.

Installing wdelta declares :func:`register` as a ``vllm.general_plugins``
entry point, which vLLM calls in every process before it builds the model;
``--weight-transfer-config '{"backend": "wdelta"}'`` then selects
:class:`wdelta.integrations.vllm_engine.WdeltaEngine`.  Registration is lazy
(vLLM imports the engine module only when the backend is chosen) and
idempotent (vLLM's ``register_engine`` refuses a name twice; vLLM may load
plugins more than once).  Importing this module does not import vLLM.

Trainer side: :func:`sync` publishes a state_dict as the chain's next version
and drives vLLM's weight-sync client (``HTTPVLLMWeightSyncClient`` over the
RL routes, or any object with its four methods) to that version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..chain.live.weights import Publisher
from ..chain.model.manifest import Version

BACKEND = "wdelta"


def register() -> None:
    """Make ``{"backend": "wdelta"}`` resolvable by vLLM's engine factory (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "wdelta.integrations.vllm_engine", "WdeltaEngine"
        )


class SyncClient(Protocol):
    """vLLM's ``VLLMWeightSyncClient``: the four calls the RL routes expose."""

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict[str, Any]) -> None: ...

    def finish_weight_update(self, weight_version: str | None = None) -> None: ...


def init_info(
    chain: str, cache: str, *, trust: str | None = None, version: int = 0
) -> dict[str, Any]:
    """The init info the ``wdelta`` backend takes, as JSON-ready data."""
    return {"chain": chain, "cache": cache, "trust": trust, "version": version}


def update_to(client: SyncClient, version: int) -> None:
    """Bring every vLLM worker behind ``client`` to chain version ``version``."""
    client.start_weight_update()
    client.update_weights({"version": version})
    client.finish_weight_update(str(version))


def sync(
    publisher: Publisher, client: SyncClient, weights: Mapping[str, Any], *,
    step: int | None = None,
) -> Version:  # fmt: skip
    """Publish ``weights`` as the chain's next version and move vLLM there; that version.

    A training loop's one call per step.  A refused update raises from
    ``update_to`` (the client's error, carrying the worker's wdelta error), the
    version stays published and vLLM's weights stay where they were.
    """
    manifest = publisher.publish(weights, step=step)
    head = manifest.head
    update_to(client, head.number)
    return head
