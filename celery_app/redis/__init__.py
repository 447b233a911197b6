"""checkbeat's Redis: the client, TLS, the key and field schema, and the Lua scripts."""
