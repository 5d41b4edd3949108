"""The commands behind ``ragwatch`` (:mod:`ragwatch.cli` parses and dispatches):
:mod:`.agent`, :mod:`.notify` (and ``silence``), :mod:`.demo`, :mod:`.replay` (and
``record``), with the argument types they share in :mod:`.argtypes`.
"""
