"""The subcommands, one thin typer module each (``register(app)``); ``mtpdiag.cli`` builds only the one a
command line runs. Shared options are spelled once in ``options``; the stages they wire are
``mtpdiag.pipeline``."""
