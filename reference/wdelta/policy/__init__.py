"""The reference encoder's policy, informative (SPEC §11.2 "Reference encoder").

Every choice the encoder makes and that a reader never needs: a chunk's encoding
(:mod:`.chunk`), its value transform (:mod:`.transform`), Rice parameters and the
position coding (:mod:`.rice`), and whether and how a sparse payload codes its
values (:mod:`.values`), with the cost models and thresholds measured on traces.
The bytes themselves are laid out by :mod:`wdelta.codec`.
"""
