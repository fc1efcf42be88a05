"""TRL: ``AsyncGRPOTrainer(weight_transfer=WdeltaWeightTransfer(...))``.

TRL 1.16's asynchronous GRPO trainer takes any object with
``init_weight_transfer``, ``pause``, ``send_weights(iterator)``, ``resume``
and ``destroy``, and calls them on the main process only; FSDP's other ranks
run the ``full_tensor()`` gathers of the same iterator beside it, so the
iterator rank 0 receives yields whole tensors.  Each ``send_weights``
publishes the iterator as one chain version and moves the vLLM server (the
``wdelta`` backend) to it.

The first ``send_weights`` (TRL syncs once at the start of training) also
initialises the server's backend: with ``served=None`` the server is taken
to hold the first version published (trainer and server loaded the same
checkpoint); on a chain that already has versions, give ``served``, the
version the server's weights are at.

LoRA: when TRL syncs adapters (a PEFT model and a server started with
``--enable-lora``) it saves each adapter to disk and loads it by name,
without calling ``weight_transfer``; wdelta is not involved.  A PEFT model
synced through ``weight_transfer`` is merged by TRL first, and the merged
weights are published like any others.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..chain.live.weights import Publisher
from ..chain.store import Chain
from .vllm import SyncClient, init_info, update_to


class ServerControl(Protocol):
    """What pauses and resumes generation (TRL's ``VLLMClient`` has both)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class WdeltaWeightTransfer:
    """TRL's weight-transfer protocol over a chain (see the module's doc).

    ``chain``: where versions are published (with ``sign=`` keys for signed
    revisions).  ``client``: vLLM's weight-sync client (``HTTPVLLMWeightSyncClient``
    on the server's URL).  ``location``/``cache``/``trust``: the chain as the
    server's workers open it, their shared cache folder, their trust-root file.
    ``server``: pauses and resumes generation around each sync (None: no pause).
    """

    def __init__(
        self, chain: Chain, client: SyncClient, *, location: str, cache: str,
        trust: str | None = None, server: ServerControl | None = None, served: int | None = None,
    ) -> None:  # fmt: skip
        self.publisher = Publisher(chain)
        self.client, self.server, self.served = client, server, served
        self.location, self.cache, self.trust = location, cache, trust
        self.version: int | None = None  # the version the server is at, once initialised

    def init_weight_transfer(self) -> None:
        """Nothing to open: the server's backend is initialised by the first sync."""

    def pause(self) -> None:
        if self.server is not None:
            self.server.pause()

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Publish the tensors as the chain's next version and move the server there."""
        weights = {name: tensor.detach().to("cpu") for name, tensor in iterator}
        published = self.publisher.publish(weights).head.number
        if self.version is None:
            at = published if self.served is None else self.served
            info = init_info(self.location, self.cache, trust=self.trust, version=at)
            self.client.init_weight_transfer_engine(info)
            self.version = at
        if published != self.version:
            update_to(self.client, published)
            self.version = published

    def resume(self) -> None:
        if self.server is not None:
            self.server.resume()

    def destroy(self) -> None:
        """Nothing held: the chain and the server's backend outlive training."""
