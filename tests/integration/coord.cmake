# coordinator, peers and CLI tests (being written).
