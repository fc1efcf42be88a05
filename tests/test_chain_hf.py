"""The Hugging Face Hub backend: everything that can be checked offline against an
in-memory stand-in for ``HfApi``/``HfFileSystem``, and live tests when a token and a
test location are configured."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from chainkit import MANIFEST_KEY, Trainer, assert_create_only, assert_delete_then_not_found
from storekit import hf
from wdelta import chain
from wdelta.chain.storage.hf import HfStorage, parse_hf_url
from wdelta.errors import WdeltaError


def test_urls() -> None:
    assert parse_hf_url("hf://buckets/me/b/run1") == parse_hf_url("hf://buckets/me/b/run1/")
    loc = parse_hf_url("hf://buckets/me/b/run1/x")
    assert (loc.kind, loc.repo_id, loc.prefix, loc.fs_root) == (
        "bucket", "me/b", "run1/x", "buckets/me/b/run1/x",
    )  # fmt: skip
    loc = parse_hf_url("hf://me/model")
    assert (loc.kind, loc.repo_id, loc.prefix, loc.fs_root) == ("model", "me/model", "", "me/model")
    assert parse_hf_url("hf://datasets/me/d/c").fs_root == "datasets/me/d/c"
    assert parse_hf_url("hf://models/me/m").kind == "model"
    for bad in ("hf://", "hf://me", "hf://buckets/me"):
        with pytest.raises(WdeltaError) as info:
            parse_hf_url(bad)
        assert info.value.category == "bad-argument"


@pytest.mark.parametrize("url", ["hf://me/model/chain", "hf://buckets/me/b/run1"])
def test_semantics(url: str, tmp_path: Path) -> None:
    st, hub = hf(url)
    src = tmp_path / "f"
    src.write_bytes(os.urandom(20_000))
    st.put_file("deltas/x.wdelta", src)
    assert f"{hub.root}/deltas/x.wdelta" in hub.files
    assert st.stat("deltas/x.wdelta") == chain.ObjectInfo("deltas/x.wdelta", 20_000)
    assert st.read_range("deltas/x.wdelta", 100, 50) == src.read_bytes()[100:150]
    assert b"".join(st.stream("deltas/x.wdelta", 7)) == src.read_bytes()[7:]
    assert_create_only(st)
    assert_delete_then_not_found(st, "deltas/x.wdelta")
    with pytest.raises(WdeltaError) as info:
        st.read_range(MANIFEST_KEY, 0, 5)
    assert info.value.category == "truncated"


def test_repo_create_retries_when_the_head_moves() -> None:
    st, hub = hf("hf://me/model")
    hub.moves = 2
    assert st.create("manifests/rev-000000000001.json", b"x") is True
    assert hub.commits == ["sha0", "sha1", "sha2"]
    hub.moves = 100
    with pytest.raises(WdeltaError) as info:
        st.create("manifests/rev-000000000002.json", b"x")
    assert info.value.category == "io-error"


def test_a_chain_over_the_hub_backend(tmp_path: Path) -> None:
    st, _ = hf("hf://buckets/me/b/run1")
    t = Trainer(rows=32, cols=64)
    ckpts = [t.save(tmp_path / "c0.safetensors")]
    c = chain.Chain(st, tmp_path / "cache")
    chain.init(c, ckpts[0])
    for n in (1, 2):
        t.step(n)
        ckpts.append(t.save(tmp_path / f"c{n}.safetensors"))
        chain.append(c, ckpts[n], ckpts[n - 1])
    local = tmp_path / "node.safetensors"
    chain.pull(chain.Chain(st, tmp_path / "n-cache"), local)
    assert local.read_bytes() == ckpts[2].read_bytes()
    chain.pull(chain.Chain(st), tmp_path / "p.safetensors", tensors="layer2.*", to=1)
    chain.verify(c, deep=True)


LIVE_URL = os.environ.get("WDELTA_HF_TEST_URL")


@pytest.mark.skipif(
    not (os.environ.get("HF_TOKEN") and LIVE_URL),
    reason="live Hub test: set HF_TOKEN and WDELTA_HF_TEST_URL (e.g. hf://buckets/ME/wdelta-test), "
    "a bucket or repo the token may write to",
)
def test_live_hub_chain(tmp_path: Path) -> None:
    assert LIVE_URL is not None
    st = HfStorage(f"{LIVE_URL.rstrip('/')}/{uuid.uuid4().hex[:12]}")
    t = Trainer(rows=32, cols=64)
    ckpts = [t.save(tmp_path / "c0.safetensors")]
    c = chain.Chain(st, tmp_path / "cache")
    chain.init(c, ckpts[0])
    t.step(1)
    ckpts.append(t.save(tmp_path / "c1.safetensors"))
    chain.append(c, ckpts[1], ckpts[0])
    local = tmp_path / "node.safetensors"
    chain.pull(chain.Chain(st, tmp_path / "n-cache"), local)
    assert local.read_bytes() == ckpts[1].read_bytes()
    assert st.create("manifests/rev-000000000002.json", b"taken") is False
    m = c.head()
    header = st.read_range(m.links[0].key, 0, 64)
    assert header[:8] == b"\x89WDELTA\n"
    for obj in st.list(""):
        st.delete(obj.key)
