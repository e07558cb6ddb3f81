"""The schema registry (see schemas/README.md): formats, compatibility, subjects and
versions kept in the metadata store."""
