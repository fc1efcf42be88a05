"""The ``wdelta`` command line.

:mod:`.app` builds the parser and runs a command; :mod:`.delta`, :mod:`.chain`,
:mod:`.signing` and :mod:`.conformance` each add their commands through a
``register(commands)`` function; :mod:`.options` defines the options several
commands share; :mod:`.flags` and :mod:`.terminal` shape what is printed.
Library code does not import this package.
"""

from .app import main, run

__all__ = ["main", "run"]
