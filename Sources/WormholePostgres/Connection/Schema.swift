import PostgresNIO
import WormholeKit

/// The engine's tables, in the schema `wormhole`, made and upgraded by numbered migrations.
///
/// Migrations run in one transaction under a transaction-level advisory lock, so that processes on several hosts
/// opening a new database at once run each of them once. `wormhole.schema_migrations` records what ran.
/// FORMAT-POSTGRES.md describes every table.
enum Schema {
    /// The newest migration this build knows.
    static var version: Int { migrations.count }

    /// The key of the advisory lock migrations take (the bytes of "wormhole").
    static let lockKey: Int64 = 0x776f_726d_686f_6c65

    /// Each migration's statements, in order; migration N is `migrations[N - 1]`. Never edit one that shipped: add
    /// a new one.
    static let migrations: [[String]] = [
        [
            "CREATE SCHEMA IF NOT EXISTS wormhole",
            """
            CREATE TABLE wormhole.groups (
                grp text PRIMARY KEY,
                channel text NOT NULL UNIQUE,
                created timestamptz NOT NULL DEFAULT now()
            )
            """,
            """
            CREATE TABLE wormhole.group_roles (
                grp text NOT NULL REFERENCES wormhole.groups ON DELETE CASCADE,
                role name NOT NULL,
                PRIMARY KEY (grp, role)
            )
            """,
            """
            CREATE TABLE wormhole.mailboxes (
                grp text NOT NULL,
                identifier text NOT NULL,
                sequence bigint NOT NULL,
                sender text NOT NULL,
                time_ns bigint NOT NULL,
                payload bytea,
                PRIMARY KEY (grp, identifier)
            )
            """,
            """
            CREATE TABLE wormhole.queues (
                grp text NOT NULL,
                queue text NOT NULL,
                next_offset bigint NOT NULL DEFAULT 0,
                first_kept bigint NOT NULL DEFAULT 0,
                PRIMARY KEY (grp, queue)
            )
            """,
            """
            CREATE TABLE wormhole.queue_records (
                grp text NOT NULL,
                queue text NOT NULL,
                "offset" bigint NOT NULL,
                sender text NOT NULL,
                time_ns bigint NOT NULL,
                payload bytea NOT NULL,
                PRIMARY KEY (grp, queue, "offset")
            )
            """,
            """
            CREATE TABLE wormhole.queue_consumers (
                grp text NOT NULL,
                queue text NOT NULL,
                consumer text NOT NULL,
                position bigint NOT NULL,
                seen timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (grp, queue, consumer)
            )
            """,
            """
            CREATE TABLE wormhole.suites (
                grp text NOT NULL,
                suite text NOT NULL,
                version bigint NOT NULL DEFAULT 0,
                PRIMARY KEY (grp, suite)
            )
            """,
            """
            CREATE TABLE wormhole.suite_values (
                grp text NOT NULL,
                suite text NOT NULL,
                key text NOT NULL,
                value text NOT NULL,
                PRIMARY KEY (grp, suite, key)
            )
            """,
            """
            CREATE TABLE wormhole.suite_changes (
                grp text NOT NULL,
                suite text NOT NULL,
                version bigint NOT NULL,
                keys text[] NOT NULL,
                set_keys text[] NOT NULL,
                set_values text[] NOT NULL,
                sender text NOT NULL,
                direction text,
                time_ns bigint NOT NULL,
                PRIMARY KEY (grp, suite, version)
            )
            """,
            """
            CREATE TABLE wormhole.live_endpoints (
                grp text NOT NULL,
                endpoint text NOT NULL,
                identifier text NOT NULL,
                kind text NOT NULL CHECK (kind IN ('listen', 'respond')),
                backend_pid integer NOT NULL,
                backend_start timestamptz NOT NULL,
                PRIMARY KEY (grp, endpoint)
            )
            """,
            "CREATE INDEX live_endpoints_identifier ON wormhole.live_endpoints (grp, identifier, kind)",
            """
            CREATE TABLE wormhole.live_bodies (
                grp text NOT NULL,
                id text NOT NULL,
                body bytea NOT NULL,
                created timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (grp, id)
            )
            """,
            """
            CREATE TABLE wormhole.transfers (
                grp text NOT NULL,
                channel text NOT NULL,
                id text NOT NULL,
                size bigint NOT NULL DEFAULT 0,
                state text NOT NULL CHECK (state IN ('staging', 'staged', 'delivering', 'delivered')),
                path text,
                updated timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (grp, channel, id)
            )
            """,
            """
            CREATE TABLE wormhole.transfer_chunks (
                grp text NOT NULL,
                channel text NOT NULL,
                id text NOT NULL,
                index integer NOT NULL,
                bytes bytea NOT NULL,
                PRIMARY KEY (grp, channel, id, index)
            )
            """,
            // Row-level security: a role that does not own the tables sees the rows of the groups granted to it
            // (`wormhole.group_roles`) and nothing else. The owner, who ran the migrations, sees every group. The
            // check runs as the caller (SECURITY INVOKER): as the owner, `current_user` would be the owner.
            """
            CREATE FUNCTION wormhole.may_use(group_name text) RETURNS boolean
            LANGUAGE sql STABLE SECURITY INVOKER SET search_path = pg_catalog, wormhole AS $$
                SELECT EXISTS (
                    SELECT 1 FROM wormhole.group_roles r
                    WHERE r.grp = group_name AND pg_has_role(current_user, r.role, 'MEMBER')
                )
            $$
            """,
            // The grants themselves: a role sees the rows naming a role it is a member of, and no other. (Its own
            // policy, not may_use, which reads this table: the check runs as the caller, so it must not recurse.)
            "ALTER TABLE wormhole.group_roles ENABLE ROW LEVEL SECURITY",
            "CREATE POLICY own_grants ON wormhole.group_roles USING (pg_has_role(current_user, role, 'MEMBER'))",
        ]
            + [
                "groups", "mailboxes", "queues", "queue_records", "queue_consumers", "suites",
                "suite_values", "suite_changes", "live_endpoints", "live_bodies", "transfers", "transfer_chunks",
            ].flatMap { table in
                [
                    "ALTER TABLE wormhole.\(table) ENABLE ROW LEVEL SECURITY",
                    "CREATE POLICY group_members ON wormhole.\(table) USING (wormhole.may_use(grp)) "
                        + "WITH CHECK (wormhole.may_use(grp))",
                ]
            },
        // Version 2: the statements on the paths of every message, as PL/pgSQL functions, whose plans each session
        // keeps after the first call: sent as plain statements, they were parsed and planned again on every call,
        // which cost more than running them. They run as the caller (SECURITY INVOKER): row-level security applies
        // as to the statements they replace. Every name in them is qualified.
        [
            // An endpoint is alive while its process's listening session holds a session-level advisory lock on
            // the endpoint's `alive_key`, a random 64-bit number of that session: a sender tries the lock in shared
            // mode, which fails while the holder lives and is released when the sender's statement commits. This
            // replaces reading every backend's status (pg_stat_get_activity), which copied them all on each send.
            // Rows of builds before this version have no key: they count as gone, and the next sweep removes them.
            "ALTER TABLE wormhole.live_endpoints ADD COLUMN alive_key bigint",
            // A live message: counts the endpoints listening whose process is alive, and notifies only if there
            // are any, in one statement, so that what is counted is what was listening at the notification.
            """
            CREATE FUNCTION wormhole.live_send(p_grp text, p_identifier text, p_channel text, p_notification text)
            RETURNS bigint LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                v_count bigint;
            BEGIN
                SELECT count(*) INTO v_count FROM wormhole.live_endpoints e
                WHERE e.grp = p_grp AND e.identifier = p_identifier AND e.kind = 'listen'
                    AND e.alive_key IS NOT NULL AND NOT pg_catalog.pg_try_advisory_xact_lock_shared(e.alive_key);
                IF v_count > 0 THEN
                    PERFORM pg_catalog.pg_notify(p_channel, p_notification);
                END IF;
                RETURN v_count;
            END
            $$
            """,
            // An append: offsets from the queue's head row, which stays locked until the append commits, so that
            // appends commit in offset order. Returns the first offset. With `p_carried`, the notification carries
            // the records: `Q`, the first offset, `:`, then `p_carried` (FORMAT-POSTGRES.md); else it is `p_notification`.
            """
            CREATE FUNCTION wormhole.queue_append(
                p_grp text, p_queue text, p_sender text, p_time_ns bigint, p_payloads bytea[], p_channel text,
                p_notification text, p_carried text
            ) RETURNS bigint LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                v_count bigint := pg_catalog.cardinality(p_payloads);
                v_first bigint;
            BEGIN
                -- The head row exists but for a queue's first append: an update, without the insert an upsert
                -- tries first.
                UPDATE wormhole.queues q SET next_offset = q.next_offset + v_count
                WHERE q.grp = p_grp AND q.queue = p_queue
                RETURNING q.next_offset - v_count INTO v_first;
                IF v_first IS NULL THEN
                    INSERT INTO wormhole.queues AS q (grp, queue, next_offset) VALUES (p_grp, p_queue, v_count)
                    ON CONFLICT (grp, queue) DO UPDATE SET next_offset = q.next_offset + EXCLUDED.next_offset
                    RETURNING q.next_offset - v_count INTO v_first;
                END IF;
                INSERT INTO wormhole.queue_records (grp, queue, "offset", sender, time_ns, payload)
                SELECT p_grp, p_queue, v_first + p.ordinal - 1, p_sender, p_time_ns, p.payload
                FROM pg_catalog.unnest(p_payloads) WITH ORDINALITY AS p(payload, ordinal);
                IF p_carried IS NULL THEN
                    PERFORM pg_catalog.pg_notify(p_channel, p_notification);
                ELSE
                    PERFORM pg_catalog.pg_notify(p_channel, 'Q' || v_first || ':' || p_carried);
                END IF;
                RETURN v_first;
            END
            $$
            """,
            // A consumer's read, after acknowledging through `p_end` when it is not null: one round trip per batch.
            // Rows of the records from the consumer's stored position, up to `p_maximum` of them and about
            // `p_byte_limit` bytes (at least one); one row with the offset -1 when there is none or `p_maximum` is
            // 0; no row when the consumer is not registered. Each row carries the consumer's position. (No null
            // column: a client decodes every row with the same types.)
            """
            CREATE FUNCTION wormhole.queue_read(
                p_grp text, p_queue text, p_consumer text, p_end bigint, p_maximum integer, p_byte_limit bigint
            ) RETURNS TABLE (consumer_position bigint, record_offset bigint, record_sender text,
                record_time_ns bigint, record_payload bytea)
            LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                v_position bigint;
            BEGIN
                IF p_end IS NULL THEN
                    SELECT c.position INTO v_position FROM wormhole.queue_consumers c
                    WHERE c.grp = p_grp AND c.queue = p_queue AND c.consumer = p_consumer;
                ELSE
                    UPDATE wormhole.queue_consumers c
                    SET position = greatest(c.position, p_end), seen = pg_catalog.now()
                    WHERE c.grp = p_grp AND c.queue = p_queue AND c.consumer = p_consumer
                    RETURNING c.position INTO v_position;
                END IF;
                IF v_position IS NULL THEN
                    RETURN;
                END IF;
                IF p_maximum < 1 THEN
                    RETURN QUERY SELECT v_position, -1::bigint, ''::text, 0::bigint, ''::bytea;
                    RETURN;
                END IF;
                RETURN QUERY
                    SELECT v_position, b."offset", b.sender, b.time_ns, b.payload FROM (
                        SELECT r."offset", r.sender, r.time_ns, r.payload,
                            sum(octet_length(r.payload)) OVER (ORDER BY r."offset") - octet_length(r.payload)
                                AS before
                        FROM wormhole.queue_records r
                        WHERE r.grp = p_grp AND r.queue = p_queue AND r."offset" >= v_position
                        ORDER BY r."offset" LIMIT p_maximum) b
                    WHERE b.before < p_byte_limit
                    ORDER BY b."offset";
                IF NOT FOUND THEN
                    RETURN QUERY SELECT v_position, -1::bigint, ''::text, 0::bigint, ''::bytea;
                END IF;
            END
            $$
            """,
        ],
        // Version 3: shared stores (PostgresStore). FORMAT-POSTGRES.md's "Stores on PostgreSQL" describes them.
        StoreSchema.migration,
        // Version 4: the stores' purge keeps merged history for a grace period, for passing consumers.
        StoreSchema.graceMigration,
        // Version 5: a grant names its role by OID. `pg_has_role` of a role's name raises when no role has that name,
        // so one dropped role broke every check of the groups it was granted, for every other role; and a new role
        // given the old name inherited the grant. Of an OID, it is false for a role that is gone, and a new role has
        // a new OID. Grants of roles gone before this migration keep no OID, and grant nothing.
        [
            "ALTER TABLE wormhole.group_roles ADD COLUMN role_oid oid",
            """
            UPDATE wormhole.group_roles r SET role_oid = a.oid FROM pg_catalog.pg_roles a WHERE a.rolname = r.role
            """,
            """
            CREATE OR REPLACE FUNCTION wormhole.may_use(group_name text) RETURNS boolean
            LANGUAGE sql STABLE SECURITY INVOKER SET search_path = pg_catalog, wormhole AS $$
                SELECT EXISTS (
                    SELECT 1 FROM wormhole.group_roles r
                    WHERE r.grp = group_name AND pg_has_role(current_user, r.role_oid, 'MEMBER')
                )
            $$
            """,
            "DROP POLICY own_grants ON wormhole.group_roles",
            """
            CREATE POLICY own_grants ON wormhole.group_roles
            USING (pg_catalog.pg_has_role(current_user, role_oid, 'MEMBER'))
            """,
        ],
        // Version 6: sealed notifications, and notifications on the channel the group's row names now.
        sealedNotificationsMigration,
        // Version 7: acknowledgements that check the records a notification carried, and store reads bounded by
        // changes (`StoreSchema.boundedReadMigration`). A member of a group holds its key, so it can seal a
        // notification that names offset N with records of its own; a consumer handles what was carried, then
        // acknowledges with each record's digest, and the position moves only when they are the table's. Otherwise
        // it stays, and the real records are read next: nothing is skipped. (Builds since 2026-12-02 check the
        // records whole in the acknowledging statement, `PostgresQueueCursor.queueAcknowledgeCheckedOne` and
        // the others, which costs the server a third of this; the two functions stay for the builds that call them.)
        [
            // SHA-256 of a record's time, its sender's length and UTF-8, and its payload.
            // STABLE as `convert_to` is: a function declared IMMUTABLE over it is not inlined, and each call then
            // costs the server about 40 µs more (pgbench, one acknowledgement of one record).
            """
            CREATE FUNCTION wormhole.queue_record_digest(p_time_ns bigint, p_sender text, p_payload bytea)
            RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
                SELECT pg_catalog.sha256(pg_catalog.int8send(p_time_ns)
                    || pg_catalog.int4send(pg_catalog.octet_length(pg_catalog.convert_to(p_sender, 'UTF8')))
                    || pg_catalog.convert_to(p_sender, 'UTF8') || p_payload)
            $$
            """,
            // `queue_read`, acknowledging through `p_end` only when every (offset, digest) given at or past the
            // consumer's position is the table's record; otherwise reading from the position as it was. One lookup on
            // the primary key per record (a join let the planner hash every record of the queue).
            """
            CREATE FUNCTION wormhole.queue_read_checked(
                p_grp text, p_queue text, p_consumer text, p_end bigint, p_maximum integer, p_byte_limit bigint,
                p_offsets bigint[], p_digests bytea[]
            ) RETURNS TABLE (consumer_position bigint, record_offset bigint, record_sender text,
                record_time_ns bigint, record_payload bytea)
            LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                v_position bigint;
                v_digest bytea;
            BEGIN
                SELECT c.position INTO v_position FROM wormhole.queue_consumers c
                WHERE c.grp = p_grp AND c.queue = p_queue AND c.consumer = p_consumer;
                FOR i IN 1..coalesce(pg_catalog.cardinality(p_offsets), 0) LOOP
                    CONTINUE WHEN p_offsets[i] < v_position;
                    SELECT wormhole.queue_record_digest(r.time_ns, r.sender, r.payload) INTO v_digest
                    FROM wormhole.queue_records r
                    WHERE r.grp = p_grp AND r.queue = p_queue AND r."offset" = p_offsets[i];
                    IF NOT FOUND OR v_digest IS DISTINCT FROM p_digests[i] THEN
                        p_end := NULL;
                        EXIT;
                    END IF;
                END LOOP;
                RETURN QUERY SELECT * FROM wormhole.queue_read(p_grp, p_queue, p_consumer, p_end, p_maximum,
                    p_byte_limit);
            END
            $$
            """,
        ] + StoreSchema.boundedReadMigration,
    ]

    /// Runs the migrations this database lacks; returns the version it is at now.
    ///
    /// - Throws: `WormholeError.Code.serverRejected` when the role may not create the schema, or when the database
    ///   was migrated by a newer build.
    @discardableResult
    static func migrate(_ connections: Connections) throws(WormholeError) -> Int {
        try connections.transaction(doing: "setting up the wormhole schema") { (connection) throws(WormholeError) in
            try connections.run("SELECT pg_advisory_xact_lock(\(lockKey))", on: connection, doing: "locking the schema")
            try connections.run(
                "CREATE SCHEMA IF NOT EXISTS wormhole",
                on: connection,
                doing: "creating the schema wormhole"
            )
            try connections.run(
                """
                CREATE TABLE IF NOT EXISTS wormhole.schema_migrations (
                    version integer PRIMARY KEY, applied timestamptz NOT NULL DEFAULT now())
                """,
                on: connection,
                doing: "creating wormhole.schema_migrations"
            )
            let rows = try connections.run(
                "SELECT coalesce(max(version), 0)::bigint FROM wormhole.schema_migrations",
                on: connection,
                doing: "reading the schema version"
            )
            let current = Int(try decode(Int64.self, rows.first, doing: "reading the schema version"))
            guard current <= version else {
                throw WormholeError(
                    .serverRejected,
                    "The wormhole schema is at version \(current), newer than this build's \(version): upgrade "
                        + "Wormhole on this host."
                )
            }
            for number in (current + 1)..<(version + 1) {
                for statement in migrations[number - 1] {
                    try connections.run(
                        PostgresQuery(unsafeSQL: statement),
                        on: connection,
                        doing: "running migration \(number)"
                    )
                }
                try connections.run(
                    "INSERT INTO wormhole.schema_migrations (version) VALUES (\(number))",
                    on: connection,
                    doing: "recording migration \(number)"
                )
            }
            return version
        }
    }

    /// The schema's version, 0 when it was never set up.
    static func currentVersion(_ connections: Connections) throws(WormholeError) -> Int {
        let what = "reading the schema version"
        // Two statements: a statement naming a missing table fails when it is parsed, whatever its CASE says.
        let exists = try connections.query(
            "SELECT to_regclass('wormhole.schema_migrations') IS NOT NULL",
            doing: what
        )
        guard try decode(Bool.self, exists.first, doing: what) else { return 0 }
        let rows = try connections.query(
            "SELECT coalesce(max(version), 0)::bigint FROM wormhole.schema_migrations",
            doing: what
        )
        return Int(try decode(Int64.self, rows.first, doing: what))
    }
}

/// The first column of `row` as `type`; a missing row or a wrong type is the server's fault, and says so.
func decode<Value: PostgresDecodable>(
    _ type: Value.Type,
    _ row: PostgresRow?,
    doing what: String
) throws(WormholeError) -> Value {
    try firstColumn(of: row, doing: what) { try $0.decode(Value.self) }
}

/// The first column of a prepared statement's `row` as `type`, as ``decode(_:_:doing:)`` reads a row.
func decode<Value: PostgresDecodable>(
    _ type: Value.Type,
    _ row: PreparedRow?,
    doing what: String
) throws(WormholeError) -> Value {
    try firstColumn(of: row, doing: what) { row in
        var columns = row.columns()
        return try columns.decode(Value.self)
    }
}

private func firstColumn<Row, Value>(
    of row: Row?,
    doing what: String,
    _ read: (Row) throws -> Value
) throws(WormholeError) -> Value {
    guard let row else {
        throw WormholeError(.serverRejected, "PostgreSQL returned no row while \(what).")
    }
    do {
        return try read(row)
    } catch {
        throw WormholeError(
            .serverRejected,
            "PostgreSQL returned an unexpected column while \(what): \(error).",
            underlyingError: SendableDescription(error)
        )
    }
}
