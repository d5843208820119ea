"""The command line faces of trl-ext: one module per command, each parsing its options and calling one library
function."""
