"""The normative codec (SPEC §6-§8), one module per unit: value transforms (§6),
byte planes (§7.2), chunk decoding (§7), sparse payloads (§7.6), their positions
(§7.6.2, §7.6.3) and coded values (§7.6.6), LEB128 and blob codecs (§8).

Each module writes its layout from given choices and reads it back, validating
every byte; which choices the encoder makes is :mod:`wdelta.policy`'s business.
Nothing here imports from :mod:`wdelta.policy`.
"""
