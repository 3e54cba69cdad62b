"""The metadata index's schema: migrations for SQLite and for PostgreSQL, step for step the same.

Step ``n`` of both lists leads to schema version ``n`` (SQLite keeps it in ``user_version``,
PostgreSQL in the one row of ``mcp_sandbox_schema``), so a version names one schema on either
engine. Append only: a released step is never edited, a change is a new step in both lists.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "POSTGRES_MIGRATIONS"]

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE tenants (
            name TEXT PRIMARY KEY,
            created REAL NOT NULL
        ) STRICT""",
        """CREATE TABLE conversations (
            key TEXT PRIMARY KEY,
            tenant TEXT NOT NULL REFERENCES tenants(name),
            created REAL NOT NULL,
            last_used REAL NOT NULL,
            bytes INTEGER NOT NULL DEFAULT 0,
            files INTEGER NOT NULL DEFAULT 0
        ) STRICT""",
        "CREATE INDEX conversations_by_last_used ON conversations(last_used)",
        """CREATE TABLE files (
            conversation TEXT NOT NULL REFERENCES conversations(key) ON DELETE CASCADE,
            name TEXT NOT NULL,
            size INTEGER NOT NULL,
            mtime REAL NOT NULL,
            PRIMARY KEY (conversation, name)
        ) STRICT, WITHOUT ROWID""",
        # conversation is not a foreign key: the history outlives the conversation's files.
        """CREATE TABLE executions (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL REFERENCES tenants(name),
            conversation TEXT,
            language TEXT NOT NULL,
            started_at REAL NOT NULL,
            duration_ms INTEGER NOT NULL,
            status TEXT NOT NULL,
            exit_code INTEGER,
            stdout_bytes INTEGER NOT NULL,
            stderr_bytes INTEGER NOT NULL,
            files_bytes INTEGER NOT NULL
        ) STRICT""",
        "CREATE INDEX executions_by_start ON executions(started_at)",
    ),
    # Retention keeps each tenant's most recent runs.
    ("CREATE INDEX executions_by_tenant ON executions(tenant, started_at)",),
    # Replicas (replica_url): one owner per conversation, and the server secret they share.
    (
        """CREATE TABLE leases (
            key TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires REAL NOT NULL,
            epoch INTEGER NOT NULL
        ) STRICT, WITHOUT ROWID""",
        """CREATE TABLE server_secret (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            secret TEXT NOT NULL
        ) STRICT""",
    ),
    # Conversations whose interpreter was lost (a lease lapsed, a replica stopped): said on the next run.
    (
        """CREATE TABLE state_lost (
            key TEXT PRIMARY KEY,
            reason TEXT NOT NULL,
            at REAL NOT NULL
        ) STRICT, WITHOUT ROWID""",
    ),
    # Forwarded calls seen, by signature, until their window is over: no replay after a restart.
    (
        """CREATE TABLE forwarded_calls (
            signature TEXT PRIMARY KEY,
            expires REAL NOT NULL
        ) STRICT, WITHOUT ROWID""",
        "CREATE INDEX forwarded_calls_by_expiry ON forwarded_calls(expires)",
    ),
    # Long runs as MCP Tasks (server/tasks): a task's row is written before its handle is returned.
    (
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            owner TEXT NOT NULL,
            status TEXT NOT NULL,
            message TEXT,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            ttl_ms INTEGER NOT NULL,
            expires REAL NOT NULL,
            heartbeat REAL NOT NULL,
            idempotency_key TEXT,
            request TEXT NOT NULL,
            result TEXT
        ) STRICT""",
        "CREATE INDEX tasks_by_tenant ON tasks(tenant, created, id)",
        "CREATE INDEX tasks_by_expiry ON tasks(expires)",
        "CREATE UNIQUE INDEX tasks_by_idempotency_key ON tasks(tenant, idempotency_key)",
    ),
)

# The same tables: SQLite's INTEGER is 64-bit (BIGINT here), its REAL a double.
POSTGRES_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE tenants (
            name TEXT PRIMARY KEY,
            created DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE conversations (
            key TEXT PRIMARY KEY,
            tenant TEXT NOT NULL REFERENCES tenants(name),
            created DOUBLE PRECISION NOT NULL,
            last_used DOUBLE PRECISION NOT NULL,
            bytes BIGINT NOT NULL DEFAULT 0,
            files BIGINT NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX conversations_by_last_used ON conversations(last_used)",
        """CREATE TABLE files (
            conversation TEXT NOT NULL REFERENCES conversations(key) ON DELETE CASCADE,
            name TEXT NOT NULL,
            size BIGINT NOT NULL,
            mtime DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (conversation, name)
        )""",
        """CREATE TABLE executions (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL REFERENCES tenants(name),
            conversation TEXT,
            language TEXT NOT NULL,
            started_at DOUBLE PRECISION NOT NULL,
            duration_ms BIGINT NOT NULL,
            status TEXT NOT NULL,
            exit_code BIGINT,
            stdout_bytes BIGINT NOT NULL,
            stderr_bytes BIGINT NOT NULL,
            files_bytes BIGINT NOT NULL
        )""",
        "CREATE INDEX executions_by_start ON executions(started_at)",
    ),
    ("CREATE INDEX executions_by_tenant ON executions(tenant, started_at)",),
    (
        """CREATE TABLE leases (
            key TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires DOUBLE PRECISION NOT NULL,
            epoch BIGINT NOT NULL
        )""",
        """CREATE TABLE server_secret (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            secret TEXT NOT NULL
        )""",
    ),
    (
        """CREATE TABLE state_lost (
            key TEXT PRIMARY KEY,
            reason TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL
        )""",
    ),
    (
        """CREATE TABLE forwarded_calls (
            signature TEXT PRIMARY KEY,
            expires DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX forwarded_calls_by_expiry ON forwarded_calls(expires)",
    ),
    (
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            owner TEXT NOT NULL,
            status TEXT NOT NULL,
            message TEXT,
            created DOUBLE PRECISION NOT NULL,
            updated DOUBLE PRECISION NOT NULL,
            ttl_ms BIGINT NOT NULL,
            expires DOUBLE PRECISION NOT NULL,
            heartbeat DOUBLE PRECISION NOT NULL,
            idempotency_key TEXT,
            request TEXT NOT NULL,
            result TEXT
        )""",
        "CREATE INDEX tasks_by_tenant ON tasks(tenant, created, id)",
        "CREATE INDEX tasks_by_expiry ON tasks(expires)",
        "CREATE UNIQUE INDEX tasks_by_idempotency_key ON tasks(tenant, idempotency_key)",
    ),
)
