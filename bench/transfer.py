"""Large-object transfer benchmark: one stream against concurrent ranged reads, one PUT
against a multipart upload, over S3 on loopback with a per-connection bandwidth cap.

    python bench/transfer.py                       # 64 MiB object, 16 MB/s per connection

Object stores cap the throughput of one connection far below a node's link (tens to a
hundred MB/s per connection against 10-100 Gbit/s), so a large object moves at the speed
of the number of connections in flight.  This script reproduces that on one machine: moto's
S3 server on 127.0.0.1 behind a proxy that sleeps after each 16 KiB block of a connection
so that no connection exceeds ``--mbps``, then times

- download: ``storage.base.download`` (one streamed GET, the path below the threshold)
  and ``transfer.download_ranges`` with 1, 2, 4 and 8 ranged reads in flight;
- upload:   ``S3Storage.put_file`` below the threshold (one PutObject) and as a multipart
            upload with 4 and 8 parts in flight.

Every download is checked byte for byte against the object.  The fastest of ``--repeat``
rounds counts.  Markdown to stdout.  Needs boto3 and moto[server] (the dev extras).

Flags:
  --mib N        object size in MiB (default 64)
  --mbps R       bandwidth cap of one connection in MB/s (default 16)
  --chunk MIB    range / part size in MiB (default 8)
  --repeat R     rounds (default 2)
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reference"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chainkit import Proxy, S3Server  # the tests' loopback S3 server and capped proxy
from wdelta.chain.storage.base import download
from wdelta.chain.storage.s3 import S3Storage
from wdelta.chain.storage.transfer import Transfer, download_ranges


def client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
        aws_secret_access_key="testing", config=Config(max_pool_connections=32),
    )  # fmt: skip


def best(fn: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--mbps", type=float, default=16.0)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    server = S3Server()
    proxy = Proxy(server.port, rate=args.mbps * 1e6)
    size, chunk = args.mib << 20, args.chunk << 20
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "object"
        data = blake3.blake3(b"bench").digest(length=size)
        src.write_bytes(data)
        st = S3Storage("bench", "", client=client(proxy.endpoint))
        st.client.create_bucket(Bucket="bench")
        st.transfer = Transfer(threshold=size + 1)
        st.put_file("object", src)
        stream = functools.partial(fetch_stream, st, tmp, size, data)
        rows = [("download", "one stream", best(stream, args.repeat))]
        for n in (1, 2, 4, 8):
            t = Transfer(threshold=1, chunk=chunk, concurrency=n)
            ranges = functools.partial(fetch_ranges, st, tmp, size, data, t)
            rows.append(("download", f"ranges, {n} in flight", best(ranges, args.repeat)))
        uploads = [("one PutObject", Transfer(threshold=size + 1))]
        uploads += [(f"multipart, {n} in flight", Transfer(threshold=1, chunk=chunk, concurrency=n))
                    for n in (4, 8)]  # fmt: skip
        for label, t in uploads:
            st.transfer = t
            put = functools.partial(st.put_file, "up", src)
            rows.append(("upload", label, best(put, args.repeat)))
    proxy.close()
    server.stop()
    print(f"### Large-object transfer: {args.mib} MiB over S3 (moto, loopback), "
          f"{args.mbps:g} MB/s per connection, {args.chunk} MiB ranges/parts\n")  # fmt: skip
    print("| direction | how | seconds | MB/s | vs one connection |")
    print("|---|---|---:|---:|---:|")
    base = {"download": rows[0][2], "upload": rows[-3][2]}
    for direction, how, secs in rows:
        print(f"| {direction} | {how} | {secs:.2f} | {size / secs / 1e6:.1f} | "
              f"{base[direction] / secs:.2f}x |")  # fmt: skip
    print(f"\n(load average {os.getloadavg()[0]:.2f}; `python bench/transfer.py "
          f"--mib {args.mib} --mbps {args.mbps:g} --chunk {args.chunk}`)")  # fmt: skip


def fetch_stream(st: S3Storage, tmp: str, size: int, data: bytes) -> None:
    part = Path(tmp) / "stream.part"
    part.unlink(missing_ok=True)
    download(st, "object", part, size)
    assert part.read_bytes() == data
    part.unlink()


def fetch_ranges(st: S3Storage, tmp: str, size: int, data: bytes, t: Transfer) -> None:
    part = Path(tmp) / "ranges.part"
    part.unlink(missing_ok=True)
    download_ranges(st, "object", part, size, None, t)
    assert part.read_bytes() == data
    part.unlink()


if __name__ == "__main__":
    main()
