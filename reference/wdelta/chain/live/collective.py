"""The collectives ranks use to agree: every rank's outcome, or rank 0's decision.

Built on ``torch.distributed``'s object collectives (``all_gather_object``,
``broadcast_object_list``), so gloo and NCCL groups work alike; torch is
imported on first use.  A peer that died or timed out makes the collective
raise, reported as ``io-error``: no rank goes on alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import BadArgumentError, StorageError, UnsupportedFeatureError, WdeltaError


def torch_distributed() -> Any:
    """``torch.distributed``, with an initialized process group (torch is optional)."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise UnsupportedFeatureError(
            "working in a process group needs torch (pip install 'wdelta[torch]')"
        ) from exc
    if not dist.is_available() or not dist.is_initialized():
        raise BadArgumentError("working in a process group needs an initialized process group "
                               "(torch.distributed.init_process_group)")  # fmt: skip
    return dist


@dataclass
class Outcome:
    """What one rank reports to the others at a synchronisation point; ``raised`` (the
    rank's own exception) stays on the rank, the others get its text."""

    error: str | None = None
    value: Any = None
    raised: WdeltaError | None = None

    @classmethod
    def failed(cls, exc: WdeltaError) -> Outcome:
        return cls(f"{type(exc).__name__}: {exc}", raised=exc)

    def __getstate__(self) -> dict[str, Any]:
        return {"error": self.error, "value": self.value, "raised": None}


class Group:
    """A process group (None: the default group) and what its ranks do together."""

    def __init__(self, group: Any, doing: str, undone: str) -> None:
        self.dist = torch_distributed()
        self.group, self.doing, self.undone = group, doing, undone
        self.rank = int(self.dist.get_rank(group))
        self.world = int(self.dist.get_world_size(group))

    def gather(self, outcome: Outcome) -> list[Outcome]:
        got: list[Any] = [None] * self.world
        try:
            self.dist.all_gather_object(got, outcome, group=self.group)
        except RuntimeError as exc:  # a peer died or timed out
            raise StorageError(f"{self.doing} aborted, the process group failed: {exc}") from exc
        return got

    def broadcast(self, outcome: Outcome | None) -> Any:
        """Rank 0's ``outcome`` on every rank."""
        box = [outcome]
        src = 0 if self.group is None else int(self.dist.get_global_rank(self.group, 0))
        try:
            self.dist.broadcast_object_list(box, src=src, group=self.group)
        except RuntimeError as exc:
            raise StorageError(f"{self.doing} aborted, the process group failed: {exc}") from exc
        return box[0]

    def agree(self, outcome: Outcome) -> list[Any]:
        """Every rank's value, or raise on every rank if any rank failed (this rank its
        own error, with its category; the others io-error naming the first that failed)."""
        got = self.gather(outcome)
        failed = [(r, o.error) for r, o in enumerate(got) if o.error is not None]
        if outcome.raised is not None:
            raise outcome.raised
        if failed:
            r, why = failed[0]
            raise StorageError(f"rank {r} failed, {self.undone}: {why}")
        return [o.value for o in got]

    def from_rank0(self, outcome: Outcome | None) -> Any:
        """Rank 0's value on every rank (``outcome`` matters on rank 0 only)."""
        result = self.broadcast(outcome)
        assert isinstance(result, Outcome)
        if outcome is not None and outcome.raised is not None:
            raise outcome.raised
        if result.error is not None:
            raise StorageError(f"rank 0 failed, {self.undone}: {result.error}")
        return result.value
