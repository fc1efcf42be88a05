"""From the store to a node: ``pull``/``follow``, verified downloads into the cache,
multi-part links, partial pulls with ranged reads, and the cache's size and pins."""
