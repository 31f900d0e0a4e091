"""Group semantics, ordering and handles; knows no frameworks and no sockets."""
