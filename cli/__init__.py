"""The `edgeinfer` command line: thin click commands that parse, call edgeinfer and print."""
