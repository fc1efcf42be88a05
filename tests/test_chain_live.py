"""Trainer publishes from memory, nodes follow into memory (local chain storage)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
from wdelta import chain
from wdelta.errors import WdeltaError

torch = pytest.importorskip("torch")

from test_torch import random_tensor, stepped, words  # noqa: E402


def state(seed: int) -> dict[str, Any]:
    return {
        "model.embed_tokens.weight": random_tensor(torch.bfloat16, (64, 32), seed),
        "model.layers.0.mlp.up_proj.weight": random_tensor(torch.float8_e4m3fn, (32, 48), seed + 1),
        "model.layers.0.mlp.up_proj.weight_scale_inv": random_tensor(torch.float32, (1, 1), seed),
        "model.norm.weight": torch.ones(32, dtype=torch.bfloat16),
    }


def next_state(s: dict[str, Any], seed: int) -> dict[str, Any]:
    return {n: stepped(t, seed, 0.05) for n, t in s.items()}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(words(a[n]), words(b[n])) for n in a)


def new_chain(tmp: Path, name: str = "store") -> chain.Chain:
    return chain.Chain(chain.open_storage(str(tmp / name)), cache=tmp / f"{name}-cache")


@pytest.mark.parametrize("on_disk", [False, True])
def test_publish_digest_is_the_files_digest(tmp_path: Path, on_disk: bool) -> None:
    """Each published version's digest is what diffing saved files would name."""
    from safetensors.torch import save_file

    c = new_chain(tmp_path)
    keep = tmp_path / "previous.safetensors" if on_disk else None
    pub = chain.Publisher(c, keep=keep)
    s = state(0)
    pub.publish(s, step=0)
    save_file(s, str(tmp_path / "s0.safetensors"))
    for k in range(1, 4):
        s = next_state(s, 10 * k)
        m = pub.publish(s, step=k)
        save_file(s, str(tmp_path / f"s{k}.safetensors"))
        a, b = tmp_path / f"s{k - 1}.safetensors", tmp_path / f"s{k}.safetensors"
        wdelta.diff(a, b, tmp_path / "files.wdelta", overwrite=True)
        with wdelta.open_delta(tmp_path / "files.wdelta") as d:
            assert m.head.digest == d.header.raw["target"]["digest"]
        assert m.head.step == k and len(m.links) == k
    chain.pull(c, tmp_path / "node.safetensors")
    assert (tmp_path / "node.safetensors").exists()
    assert chain.weights_digest(s) == m.head.digest
    assert keep is None or keep.exists()


def test_publisher_copies_into_the_previous_arrays(tmp_path: Path) -> None:
    """The copy kept in memory is rewritten in place step after step (fresh arrays
    cost a page fault per 4 KiB), and stays a copy: the trainer may change its
    tensors in place after publishing, in place in the next step too."""
    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    live = {n: t.clone() for n, t in state(0).items()}
    pub.publish(live, step=0)
    kept = dict(pub._previous)  # type: ignore[arg-type]
    for k in range(1, 4):
        new = next_state(live, 10 * k)
        for n, t in live.items():
            t.copy_(new[n])  # the trainer's optimizer step, in place
        m = pub.publish(live, step=k)
        assert m.head.digest == chain.weights_digest(new)
        assert all(pub._previous[n] is kept[n] for n in kept)  # type: ignore[index]
    for t in live.values():
        t.view(torch.uint8).reshape(-1)[0] ^= 1
    assert chain.weights_digest(pub._previous) == m.head.digest  # type: ignore[arg-type]
    node, _ = chain.load(c, device="cpu")
    assert same(node, new)


def _reshaped(s: dict[str, Any], seed: int) -> dict[str, Any]:
    """A step that also adds, removes and reshapes tensors."""
    out = next_state(s, seed)
    del out["model.norm.weight"]
    out["model.layers.0.mlp.up_proj.weight_scale_inv"] = random_tensor(torch.float32, (2,), seed)
    out["lm_head.weight"] = random_tensor(torch.bfloat16, (8, 32), seed)
    return out


@pytest.mark.parametrize("on_disk", [False, True])
def test_publish_links_equal_the_diff_of_the_files(tmp_path: Path, on_disk: bool) -> None:
    """Every tensor digest of each published link (both sides) is what ``diff`` of the
    two saved files records, with tensors changed, added, removed and reshaped: the
    digests kept from the step before stand for the previous copy's, and the copy
    brought forward by applying the link is the new weights bit for bit."""
    from safetensors.torch import save_file

    c = new_chain(tmp_path)
    keep = tmp_path / "previous.safetensors" if on_disk else None
    pub = chain.Publisher(c, keep=keep)
    s = state(0)
    pub.publish(s)
    for k in range(1, 4):
        before, s = s, (_reshaped(s, 10 * k) if k == 2 else next_state(s, 10 * k))
        m = pub.publish(s)
        save_file(before, str(tmp_path / "a.safetensors"))
        save_file(s, str(tmp_path / "b.safetensors"))
        files = wdelta.diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors",
                            tmp_path / "files.wdelta", overwrite=True)  # fmt: skip
        link = tmp_path / "store" / m.links[-1].key
        with wdelta.open_delta(files) as d, wdelta.open_delta(link) as e:
            assert _digests_of(e) == _digests_of(d)
            assert e.header.raw["base"]["digest"] == d.header.raw["base"]["digest"]
    if keep is None:
        assert chain.weights_digest(pub._previous) == chain.weights_digest(s)  # type: ignore[arg-type]


def _digests_of(d: Any) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    return {(t.name, t.op): (t.base_digest, t.target_digest) for t in d.header.tensors}


def test_publish_neither_hashes_nor_copies_the_previous_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After version 0 a step feeds no base words to a digest and makes no full copy
    of the weights: the previous copy's digests are kept from the step before, and
    the copy is brought forward by the link's changed words."""
    from wdelta.chain.live import weights as live
    from wdelta.ops import pipeline

    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    s = state(0)
    pub.publish(s)
    fed: list[int] = []
    real = pipeline.TensorDigests.feed

    def feed(self: Any, seq: Any, which: int, index: int, words: Any) -> None:
        fed.append(which)
        real(self, seq, which, index, words)

    def no_copy(*args: Any) -> None:
        raise AssertionError("the weights were copied whole")

    monkeypatch.setattr(pipeline.TensorDigests, "feed", feed)
    monkeypatch.setattr(live, "_host_copy", no_copy)
    for k in range(1, 3):
        s = next_state(s, k)
        assert pub.publish(s).head.digest == chain.weights_digest(s)
    assert fed and set(fed) == {1}


@pytest.mark.parametrize("on_disk", [False, True])
def test_check_previous_refuses_a_modified_copy(tmp_path: Path, on_disk: bool) -> None:
    """A previous copy changed behind the publisher's back: with ``check_previous``
    nothing is published (base-mismatch, the head stays); without it the copy is
    trusted and its kept digest goes into the link (documented)."""
    keep = tmp_path / "previous.safetensors" if on_disk else None
    c = new_chain(tmp_path)
    checked = chain.Publisher(c, keep=keep, check_previous=True)
    s0 = state(0)
    checked.publish(s0)
    s1 = next_state(s0, 1)
    assert checked.publish(s1).head.number == 1  # an intact copy passes the check
    name = "model.embed_tokens.weight"
    if keep is None:
        checked._previous[name].view("u2").reshape(-1)[5] ^= 1  # type: ignore[index]
    else:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(keep))
        tensors[name].view(torch.int16).reshape(-1)[5] ^= 1
        save_file(tensors, str(keep))
    with pytest.raises(wdelta.BaseMismatchError, match=name):
        checked.publish(next_state(s1, 2))
    assert c.head().head.number == 1


def test_publisher_refuses_an_existing_chain_without_previous(tmp_path: Path) -> None:
    c = new_chain(tmp_path)
    chain.Publisher(c).publish(state(0))
    with pytest.raises(wdelta.BadArgumentError):
        chain.Publisher(c).publish(state(1))
    resumed = chain.Publisher(c, previous=state(0))
    assert resumed.publish(next_state(state(0), 3)).head.number == 1


def test_follow_weights_reaches_each_version(tmp_path: Path) -> None:
    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    s = state(0)
    pub.publish(s, step=0)
    weights, v0 = chain.load(new_chain(tmp_path), device="cpu")
    assert v0.number == 0 and same(weights, s)
    published = [s]
    for k in range(1, 4):
        published.append(next_state(published[-1], k))
        pub.publish(published[-1], step=k)
    node = new_chain(tmp_path, "store")
    node.cache = tmp_path / "node-cache"
    seen = []
    for v in chain.follow_weights(node, weights, interval=0, max_polls=1):
        seen.append(v.number)
        assert same(weights, published[v.number])
    assert seen == [1, 2, 3]


def test_corrupted_link_leaves_the_previous_version(tmp_path: Path) -> None:
    """A delta corrupted in storage: reported as checksum-mismatch, weights untouched,
    retried with backoff, and applied once storage holds the right bytes again."""
    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    s0, s1 = state(0), next_state(state(0), 1)
    pub.publish(s0)
    m = pub.publish(s1)
    key = tmp_path / "store" / m.links[0].key
    good = key.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 1
    key.write_bytes(bytes(bad))
    weights = {n: t.clone() for n, t in s0.items()}
    errors: list[tuple[str, int]] = []

    def report(exc: WdeltaError, failures: int) -> None:
        errors.append((exc.category, failures))
        assert same(weights, s0)  # never a mix
        if failures == 2:
            key.write_bytes(good)

    follower = chain.follow_weights(
        new_chain(tmp_path), weights, interval=0, max_polls=3, backoff=(0.01, 0.02),
        on_error=report,
    )  # fmt: skip
    assert [v.number for v in follower] == [1]
    assert errors == [("checksum-mismatch", 1), ("checksum-mismatch", 2)]
    assert same(weights, s1)


def test_partial_follow_keeps_only_selected_tensors(tmp_path: Path) -> None:
    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    s = state(0)
    pub.publish(s)
    pattern = "model.layers.0.*"
    weights, v0 = chain.load(new_chain(tmp_path), tensors=pattern, device="cpu")
    assert set(weights) == {n for n in s if n.startswith("model.layers.0.")}
    s1 = next_state(s, 4)
    pub.publish(s1)
    got = list(chain.follow_weights(
        new_chain(tmp_path), weights, at=v0.number, tensors=pattern, interval=0, max_polls=1
    ))  # fmt: skip
    assert [v.number for v in got] == [1]
    assert same(weights, {n: s1[n] for n in weights})
    with pytest.raises(wdelta.BadArgumentError):
        next(chain.follow_weights(new_chain(tmp_path), weights, tensors=pattern, max_polls=1))


def _bigger_state(seed: int) -> dict[str, Any]:
    """A model whose selected tensors are a small part of each link."""
    return {
        "model.embed_tokens.weight": random_tensor(torch.bfloat16, (512, 256), seed),
        "model.layers.0.mlp.up_proj.weight": random_tensor(torch.bfloat16, (32, 48), seed + 1),
        "model.layers.1.mlp.up_proj.weight": random_tensor(torch.bfloat16, (256, 256), seed + 2),
    }


def test_partial_follow_reads_only_its_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank applies each link from ranged reads of its header and its own tensors'
    blobs: no whole link is downloaded, far fewer bytes than the links are read, and a
    corrupted blob of its tensors is refused (weights untouched) while one of another
    rank's tensors is never read."""
    c = new_chain(tmp_path)
    pub = chain.Publisher(c, options=chain.AppendOptions(chunk_elements=4096))
    published = [_bigger_state(0)]
    pub.publish(published[0])
    pattern = "model.layers.0.*"
    weights, v0 = chain.load(new_chain(tmp_path), tensors=pattern, device="cpu")
    for k in range(1, 3):
        published.append({n: stepped(t, k, 0.3) for n, t in published[-1].items()})
        m = pub.publish(published[-1])
    node = new_chain(tmp_path, "store")
    node.cache = tmp_path / "rank-cache"
    read: list[int] = []
    real = type(node.storage).read_range

    def counting(self: Any, key: str, offset: int, length: int) -> bytes:
        read.append(length)
        return real(self, key, offset, length)

    monkeypatch.setattr(type(node.storage), "read_range", counting)
    stored = tmp_path / "store" / m.links[-1].key
    good = stored.read_bytes()
    with wdelta.open_delta(stored) as d:
        blob = {t.name: t.chunks[-1] for t in d.header.tensors}
        at = {n: d.data_start + c.offset + c.length // 2 for n, c in blob.items()}
        corrupted = ("model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight")
        assert all(blob[n].inline is None for n in corrupted)  # blobs of the data section
    errors: list[str] = []

    def corrupt(name: str) -> None:
        bad = bytearray(good)
        bad[at[name]] ^= 1
        stored.write_bytes(bytes(bad))

    def report(exc: WdeltaError, failures: int) -> None:
        errors.append(exc.category)
        assert same(weights, {n: published[1][n] for n in weights})  # never a mix
        corrupt("model.embed_tokens.weight")  # not this rank's: never read

    corrupt("model.layers.0.mlp.up_proj.weight")
    got = chain.follow_weights(
        node, weights, at=v0.number, tensors=pattern, interval=0, max_polls=2,
        backoff=(0.01, 0.01), on_error=report,
    )  # fmt: skip
    assert [v.number for v in got] == [1, 2]
    assert errors == ["checksum-mismatch"]
    assert same(weights, {n: published[2][n] for n in weights})
    assert not any(node.is_cached(link.digest) for link in m.links)
    assert 0 < sum(read) < sum(link.size for link in m.links) / 4


@pytest.mark.parametrize(("pattern", "start"), [(None, 0), ("model.layers.0.*", 0), (None, 1)])
def test_follow_jumps_to_a_snapshot_when_no_links_lead_on(
    tmp_path: Path, pattern: str | None, start: int
) -> None:
    """Links pruned away (and the node's version too, from 1): the node pulls the head
    (a snapshot), diffs it against its weights in memory and applies that in place;
    the same tensor objects end at the head."""
    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    published = [state(0)]
    pub.publish(published[0])
    for k in range(1, 4):
        published.append(next_state(published[-1], k))
        pub.publish(published[-1], snapshot=k == 3)
        if k == 1:
            weights, v0 = chain.load(new_chain(tmp_path), to=start, tensors=pattern, device="cpu")
            ids = {n: id(t) for n, t in weights.items()}
    m, _ = chain.prune(c, chain.Policy(snapshot_every=1000, keep_links=0, keep_revisions=1))
    assert m.links == () and [v.number for v in m.versions] == [0, 3]
    got = chain.follow_weights(
        new_chain(tmp_path), weights, at=v0.number, tensors=pattern, interval=0, max_polls=1
    )  # fmt: skip
    assert [v.number for v in got] == [3]
    assert same(weights, {n: published[3][n] for n in weights})
    assert {n: id(t) for n, t in weights.items()} == ids


def test_load_without_a_cache_leaves_none_behind(tmp_path: Path) -> None:
    c = new_chain(tmp_path)
    chain.Publisher(c).publish(state(0))
    node = chain.Chain(chain.open_storage(str(tmp_path / "store")))
    weights, version = chain.load(node)
    assert version.number == 0 and node.cache is None
    assert {n: a.tobytes() for n, a in weights.items()} == {
        n: words(t).tobytes() for n, t in state(0).items()
    }  # NumPy arrays (device=None), bit-identical to the published tensors


def test_a_failed_snapshot_save_takes_the_copy_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The diff brought the copy forward; the snapshot's save then fails before the
    append: nothing is published and the copy is the previous version again."""
    from wdelta.chain.live import weights as live_weights

    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    s0 = state(0)
    pub.publish(s0, step=0)
    s1 = next_state(s0, 1)

    def full(*args: Any, **kwargs: Any) -> None:
        raise wdelta.StorageError("injected: the disk is full")

    with monkeypatch.context() as m:
        m.setattr(live_weights, "save_weights", full)
        with pytest.raises(wdelta.StorageError, match="disk is full"):
            pub.publish(s1, step=1, snapshot=True)
    assert c.head().head.number == 0
    assert chain.weights_digest(pub._previous) == chain.weights_digest(s0)  # type: ignore[arg-type]
    assert pub.publish(s1, step=1).head.digest == chain.weights_digest(s1)
    weights, _ = chain.load(new_chain(tmp_path), device="cpu")
    assert same(weights, s1)


@pytest.mark.parametrize("native_path", ["1", "portable", "0"])
def test_publish_failures_keep_or_drop_the_previous_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native_path: str
) -> None:
    """The diff brings the copy forward as it goes (changed words from the compiled
    pass, or whole chunks on the NumPy path).  A refused append publishes nothing
    and takes the copy back (the next step diffs against it: the chain replays to
    the right weights); a diff or a take-back that is interrupted drops the copy,
    and publishing resumes with ``previous=``."""
    from wdelta.chain.live import weights as live_weights
    from wdelta.ops import inplace
    from wdelta.policy import chunk as chunk_policy

    monkeypatch.setenv("WDELTA_NATIVE", native_path)
    c = new_chain(tmp_path)
    pub = chain.Publisher(c)
    # A chunk above 64 KiB: the compiled change pass itself brings it forward.
    big = random_tensor(torch.bfloat16, (256, 256), 7)
    s0 = {**state(0), "model.layers.0.mlp.down_proj.weight": big}
    pub.publish(s0, step=5)
    s1 = next_state(s0, 1)
    with pytest.raises(chain.ConflictError):
        pub.publish(s1, step=3)
    assert chain.weights_digest(pub._previous) == chain.weights_digest(s0)  # type: ignore[arg-type]
    assert pub.publish(s1, step=6).head.digest == chain.weights_digest(s1)
    assert chain.weights_digest(pub._previous) == chain.weights_digest(s1)  # type: ignore[arg-type]
    s2 = next_state(s1, 2)

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    def encoded_then_interrupted(*args: Any) -> None:
        encode_modified(*args)  # the chunk's part of the copy brought forward, then Ctrl-C
        raise KeyboardInterrupt

    encode_modified = chunk_policy.encode_modified
    with monkeypatch.context() as m:
        m.setattr(chunk_policy, "encode_modified", encoded_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            pub.publish(s2, step=7)
    assert c.head().head.digest == chain.weights_digest(s1)  # nothing published
    with pytest.raises(wdelta.BadArgumentError, match="previous="):
        pub.publish(s2, step=7)
    pub = chain.Publisher(c, previous=s1)
    with monkeypatch.context() as m:  # the take-back after a refused append
        m.setattr(inplace, "_write_chunk", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pub.publish(s2, step=2)
    assert pub._previous is None
    assert c.head().head.digest == chain.weights_digest(s1)
    pub = chain.Publisher(c, previous=s1)
    assert pub.publish(s2, step=7).head.digest == chain.weights_digest(s2)
    # A step that adds a tensor is applied to the copy after the append (the diff
    # brings forward only tensors present on both sides); interrupted, the copy
    # is dropped although the version is published.
    s3 = {**next_state(s2, 3), "lm_head.weight": random_tensor(torch.bfloat16, (8, 8), 9)}
    assert live_weights.Publisher._advance_words(pub, s3) is None
    with monkeypatch.context() as m:
        m.setattr(inplace, "_write_chunk", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pub.publish(s3, step=8)
    assert c.head().head.digest == chain.weights_digest(s3)
    with pytest.raises(wdelta.BadArgumentError, match="previous="):
        pub.publish(next_state(s3, 4), step=9)
    resumed = chain.Publisher(c, previous=s3)
    assert resumed.publish(next_state(s3, 4), step=9).head.number == 4
    weights, _ = chain.load(new_chain(tmp_path), device="cpu")
    assert same(weights, next_state(s3, 4))
