"""Stand-in servers for tests: real HTTP on 127.0.0.1, misbehaving on purpose."""
