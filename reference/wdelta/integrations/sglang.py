"""SGLang: the same contract through a custom weight loader, without patching SGLang.

SGLang has no weight-transfer registry, but ``--custom-weight-loader
wdelta.integrations.sglang.load_version`` lets ``update_weights_from_tensor(
named_tensors, load_format="wdelta.integrations.sglang.load_version")`` call
``load_version(model, named_tensors)`` on every TP rank.  The trainer sends
one small tensor, :func:`request` (the chain, the node's cache, the trust
root, the version the server's weights are at and the version wanted, as
JSON bytes); each rank keeps its host copy on the model, moves it (every
tensor digest checked before the model is written) and hands the changed
tensors to the model's own ``load_weights``, as the vLLM backend does.

Why not the other two: ``update_weights_from_tensor`` with the tensors
themselves ships every changed tensor from the trainer through the server's
process (no versions, no checks); ``update_weights_from_disk`` reloads a
whole checkpoint folder, every tensor, for each step.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import BadArgumentError
from .node import InitInfo, NodeWeights

REQUEST = "wdelta.request"  # the one tensor name load_version accepts
LOADER = "wdelta.integrations.sglang.load_version"  # for --custom-weight-loader / load_format


def request(info: dict[str, Any], version: int) -> list[tuple[str, Any]]:
    """``named_tensors`` for ``update_weights_from_tensor``: move to ``version``.  ``info``
    is the vLLM backend's init info (``vllm.init_info``); its ``version`` is the one the
    server's weights are at when the first request arrives."""
    import torch

    data = json.dumps({"init": info, "version": version}).encode()
    return [(REQUEST, torch.frombuffer(bytearray(data), dtype=torch.uint8))]


def load_version(model: Any, named_tensors: list[tuple[str, Any]]) -> None:
    """SGLang's custom weight loader: bring ``model`` to the version requested."""
    if len(named_tensors) != 1 or named_tensors[0][0] != REQUEST:
        raise BadArgumentError(
            f"{LOADER} takes one tensor named {REQUEST!r} (wdelta.integrations.sglang.request)"
        )
    try:
        asked = json.loads(bytes(named_tensors[0][1].cpu().numpy()))
        init, version = InitInfo(**asked["init"]), asked["version"]
    except (ValueError, TypeError, KeyError) as exc:
        raise BadArgumentError(f"{LOADER}: not a wdelta request ({exc})") from exc
    node: NodeWeights | None = getattr(model, "_wdelta_node", None)
    if node is None or node.location != (init.chain, init.cache):
        node = NodeWeights(init)
        model._wdelta_node = node
    model.load_weights(iter(node.move(version)))
