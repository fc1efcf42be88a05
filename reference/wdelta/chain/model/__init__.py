"""The chain manifest model: versions, links, snapshots (rules CH-1..CH-9) and the
cheapest path between versions; pure data."""
