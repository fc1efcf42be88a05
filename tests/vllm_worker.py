"""One vLLM worker (one TP rank) driving the ``wdelta`` backend through vLLM's own
plugin loading and engine factory; run by test_integrations_vllm.py.

argv: chain, tampered chain, wrong-base chain, cache, model folder, tp, rank,
rendezvous file, versions (the honest chain's head).  Exits 0 when every check
passed; an assertion says which failed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from wdelta import chain
from wdelta.errors import WdeltaError
from wdelta.integrations import vllm as wvllm
from wdelta.testing import vllm_cpu as vllmkit


def engine_for(
    config: Any, model: Any, folder: str, cache: str, version: int, prefetch: float | None = None
) -> Any:
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="wdelta"), config, model.lm_head.weight.device, model
    )
    info = {"chain": folder, "cache": cache, "trust": None, "version": version,
            "prefetch": prefetch}  # fmt: skip
    engine.init_transfer_engine(engine.parse_init_info(info))
    return engine


def update(engine: Any, version: int) -> None:
    """The calls vLLM's worker makes for one update (start, update, finish)."""
    engine.prefetch(version)
    engine.start_weight_update()
    engine.update_weights({"version": version})
    engine.finish_weight_update()


def full_load(model: Any, folder: str, cache: str, version: int) -> dict[str, bytes]:
    """Parameters after loading version ``version``'s whole checkpoint into ``model``."""
    weights, _ = chain.load(chain.Chain(folder, cache=cache), to=version, device="cpu")
    model.load_weights(iter(sorted(weights.items())))
    return vllmkit.params_bits(model)


def over_http(engine: Any, init: dict[str, Any], version: int) -> None:
    """vLLM's RL routes (its own router, under a test client) and its HTTP weight-sync
    client drive ``engine`` as the worker would: init, then ``update_to(version)``."""
    from fastapi import FastAPI
    from starlette.testclient import TestClient
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.entrypoints.rl.online.api_router import router

    class EngineClient:  # one worker behind vLLM's engine client (collective_rpc)
        async def init_weight_transfer_engine(self, request: Any) -> None:
            engine.init_transfer_engine(engine.parse_init_info(request.init_info))

        async def start_weight_update(self) -> None:
            engine.start_weight_update()

        async def update_weights(self, request: Any) -> None:
            engine.update_weights(request.update_info)

        async def finish_weight_update(self, weight_version: str | None) -> None:
            engine.finish_weight_update()

    app = FastAPI()
    app.include_router(router)
    app.state.engine_client = EngineClient()
    web = TestClient(app)
    client = HTTPVLLMWeightSyncClient("http://testserver")
    client._post = lambda path, json=None: web.post(f"/{path}", json=json).raise_for_status()
    client.init_weight_transfer_engine(init)
    wvllm.update_to(client, version)


def main(argv: list[str]) -> None:
    good, tampered, wrong_base, cache, folder = argv[:5]
    tp, rank, rendezvous, head = int(argv[5]), int(argv[6]), Path(argv[7]), int(argv[8])
    config = vllmkit.init_vllm(Path(folder), tp, rank, rendezvous)
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # the entry point registers "wdelta"; nothing else does
    served, reference = vllmkit.build_model(config), vllmkit.build_model(config)
    full_load(served, good, cache, 0)
    # its background prefetch runs beside the updates (each rank's, on one cache)
    engine = engine_for(config, served, good, cache, 0, prefetch=0.05)
    for v in range(1, head + 1):
        update(engine, v)
        assert vllmkit.params_bits(served) == full_load(reference, good, cache, v), v
        assert engine.last_bytes > 0, v
    update(engine, 2)  # below the current version: reverse links
    assert vllmkit.params_bits(served) == full_load(reference, good, cache, 2)
    update(engine, head)  # several versions at once
    expected = full_load(reference, good, cache, head)
    for bad in (tampered, wrong_base):
        refused = engine_for(config, served, bad, cache + "-bad", head)
        try:
            update(refused, head + 1)
        except WdeltaError as exc:  # the error names the link's object that failed
            assert "deltas/" in str(exc), exc
        else:
            raise AssertionError(f"{bad}: a bad version was accepted")
        assert vllmkit.params_bits(served) == expected, "a refused update wrote the model"
        refused.shutdown()
    engine.shutdown()
    restarted = vllmkit.build_model(config)  # a worker restarted from the base checkpoint
    full_load(restarted, good, cache, 0)
    update(engine_for(config, restarted, good, cache, 0), head)
    assert vllmkit.params_bits(restarted) == expected
    if tp == 1:
        init = {"chain": good, "cache": cache, "trust": None, "version": head, "prefetch": None}
        over_http(engine, init, head + 1)
        assert vllmkit.params_bits(served) == full_load(reference, good, cache, head + 1)
    print(f"rank {rank}: ok")


if __name__ == "__main__":
    main(sys.argv[1:])
