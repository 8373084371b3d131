"""Subcommands of the ``inferlearn`` CLI, one module each."""
