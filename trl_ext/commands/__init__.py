"""The command line faces of trl-ext: one module per command, parsing, shared output handling."""
