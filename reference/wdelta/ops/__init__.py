"""Operations on deltas: diff, apply, apply in place, verify, streams of changes, summaries."""
