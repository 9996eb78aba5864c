"""Model tier: seeded random programs run step by step on the embedded broker (the
reference) and on Redis or Redis Cluster, which must agree at every step. They check the
brokers' rules against each other, which do not depend on the interpreter running the
suite, so ``make test`` runs this tier on the first interpreter only (as tests/tooling)."""
