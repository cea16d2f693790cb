"""ropekit's contacts with other libraries' internals, one module per library.

:mod:`.transformers` is the only module of ropekit that reads or writes transformers' registries, private
attributes and module globals; everything else calls it. It sits below every other package (it imports only
:mod:`ropekit.errors`), so any layer may use it, and it registers nothing by itself.
"""
