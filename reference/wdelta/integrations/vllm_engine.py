"""The ``wdelta`` weight-transfer engine, built by vLLM in each GPU worker.

vLLM builds it with ``(config, vllm_config, device, model)`` after the model
is loaded, then calls ``init_transfer_engine`` once and, per update,
``start_weight_update``, ``update_weights({"version": N})`` and
``finish_weight_update``.  ``receive_weights`` moves the worker's host copy
to version N (everything verified before the model is written) and hands the
changed tensors to the model's own ``load_weights``, which fuses and splits
them for this rank, exactly as a full load of version N would.

Why start/finish are no-ops: vLLM's layerwise reload rebuilds fused layers
from the tensors it is given; with only the changed tensors the untouched
slices of ``qkv_proj``/``gate_up_proj`` would come from uninitialised memory,
and the worker does not call finish after a failed update.  Quantized
models, which need that reload to be exact, are refused at construction.

Downloads: ``prefetch`` (see ``NodeWeights.prepare``) downloads a move ahead
into the cache the node's workers share, one download per object whatever
the number of workers; ``receive_weights`` reads only the cache when that
was done.  ``receive_weights`` to a version below the current one follows
the reverse links (every link a ``Publisher`` writes is reversible).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine

from ..errors import BadArgumentError
from .node import InitInfo, NodeWeights, UpdateInfo


class WdeltaEngine(WeightTransferEngine):  # type: ignore[misc]
    """vLLM worker side of the ``wdelta`` backend (see the module's doc)."""

    init_info_cls = InitInfo
    update_info_cls = UpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        quantization = getattr(self.model_config, "quantization", None)
        if quantization is not None:
            raise BadArgumentError(
                f"the wdelta backend cannot update a quantized model ({quantization}) bit for "
                "bit: serve the unquantized checkpoint"
            )
        self.node: NodeWeights | None = None
        self.last_bytes = 0  # bytes handed to load_weights by the last update

    def parse_init_info(self, init_dict: dict[str, Any]) -> InitInfo:
        return InitInfo(**_fields(init_dict, InitInfo))

    def parse_update_info(self, update_dict: dict[str, Any]) -> UpdateInfo:
        return UpdateInfo(**_fields(update_dict, UpdateInfo))

    def init_transfer_engine(self, init_info: InitInfo) -> None:
        self.shutdown()
        self.node = NodeWeights(init_info)

    def start_weight_update(self) -> None:
        """Nothing to prepare: updates write only the changed tensors, in place."""

    def finish_weight_update(self) -> None:
        """Nothing to finish: ``receive_weights`` has written everything or nothing."""

    def prefetch(self, version: int) -> int:
        """Download what moving to ``version`` needs into the shared cache; bytes downloaded."""
        return self._node().prepare(version)

    def receive_weights(self, update_info: UpdateInfo) -> None:
        """Move to ``update_info.version`` and load the changed tensors into the model."""
        changed = self._node().move(update_info.version)
        self.last_bytes = sum(t.numel() * t.element_size() for _, t in changed)
        self.model.load_weights(iter(changed))

    def shutdown(self) -> None:
        if self.node is not None:
            self.node.close()
        self.node = None

    def _node(self) -> NodeWeights:
        if self.node is None:
            raise BadArgumentError("the wdelta engine was not initialised (init_transfer_engine)")
        return self.node


def _fields(given: dict[str, Any], cls: type) -> dict[str, Any]:
    """``given`` if it is an object with ``cls``'s keys (the required ones at least); a
    bad-argument error otherwise."""
    if not isinstance(given, dict):
        raise BadArgumentError(f"weight-transfer info must be a JSON object, not {given!r}")
    fields = dataclasses.fields(cls)
    unknown = sorted(set(given) - {f.name for f in fields})
    if unknown:
        raise BadArgumentError(f"weight-transfer info: unknown key {unknown[0]!r}")
    for f in fields:
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in given:
            raise BadArgumentError(f"weight-transfer info: missing key {f.name!r}")
    return given
