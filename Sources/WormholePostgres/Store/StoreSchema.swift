/// The tables and functions of shared stores on PostgreSQL: migrations 3 and 4 of ``Schema``.
///
/// A store is a schema of the user's tables, each with a row trigger (`wormhole_history`) that records the row's
/// table, operation and primary key in `wormhole.store_changes`, under the transaction's `xid8`. The transaction's
/// first change of a store queues a deferred constraint trigger, which at commit gives the transaction its history
/// id from the store's row in `wormhole.stores`, whose lock it keeps until the commit ends, and records it in
/// `wormhole.store_transactions`: so ids are handed out in commit order, with no gap, whenever each transaction began
/// (a `bigserial` would be taken at the first write, and a transaction that began earlier but commits later would
/// appear behind a reader's back). The cost: the commits of one store pass one at a time through the end of their
/// transaction.
enum StoreSchema {
    static let migration: [String] =
        [
            """
            CREATE TABLE wormhole.stores (
                grp text NOT NULL,
                store text NOT NULL,
                last_id bigint NOT NULL DEFAULT 0,
                created timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (grp, store)
            )
            """,
            """
            CREATE TABLE wormhole.store_transactions (
                grp text NOT NULL,
                store text NOT NULL,
                id bigint NOT NULL,
                xid xid8 NOT NULL,
                author text NOT NULL,
                committed timestamptz NOT NULL,
                PRIMARY KEY (grp, store, id)
            )
            """,
            """
            CREATE TABLE wormhole.store_changes (
                grp text NOT NULL,
                store text NOT NULL,
                xid xid8 NOT NULL,
                seq bigint GENERATED ALWAYS AS IDENTITY,
                tbl text NOT NULL,
                op text NOT NULL CHECK (op IN ('i', 'u', 'd')),
                pk jsonb NOT NULL,
                -- The transaction's first change of this store: its row queues the commit-time trigger.
                first boolean NOT NULL DEFAULT false,
                PRIMARY KEY (grp, store, xid, seq)
            )
            """,
            """
            CREATE TABLE wormhole.store_consumers (
                grp text NOT NULL,
                store text NOT NULL,
                consumer text NOT NULL,
                token bigint NOT NULL,
                seen timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (grp, store, consumer)
            )
            """,
            """
            CREATE TABLE wormhole.store_migrations (
                grp text NOT NULL,
                store text NOT NULL,
                name text NOT NULL,
                applied timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (grp, store, name)
            )
            """,
            // The row trigger of every tracked table. Its arguments, fixed when the trigger is made: the group, the
            // store, the primary key's columns and the table's name. A transaction's first change of a store is
            // marked `first` (a transaction-local setting remembers it; a savepoint rolled back forgets it with the
            // row), which queues the commit-time trigger once per transaction.
            """
            CREATE FUNCTION wormhole.store_record() RETURNS trigger
            LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                v_grp text := TG_ARGV[0];
                v_store text := TG_ARGV[1];
                v_key text[] := TG_ARGV[2]::text[];
                -- The tracked table's name: a partition's rows are recorded under their partitioned table.
                v_table text := coalesce(TG_ARGV[3], TG_TABLE_NAME);
                v_xid xid8 := pg_catalog.pg_current_xact_id();
                v_marker text;
                v_first boolean;
                v_new jsonb;
                v_old jsonb;
                v_new_key jsonb := '{}'::jsonb;
                v_old_key jsonb := '{}'::jsonb;
            BEGIN
                v_marker := 'wormhole.recording_' || pg_catalog.md5(v_grp || '/' || v_store);
                v_first := pg_catalog.current_setting(v_marker, true) IS DISTINCT FROM v_xid::text;
                IF v_first THEN
                    PERFORM pg_catalog.set_config(v_marker, v_xid::text, true);
                END IF;
                IF TG_OP <> 'INSERT' THEN
                    v_old := pg_catalog.to_jsonb(OLD);
                    SELECT coalesce(pg_catalog.jsonb_object_agg(k, v_old -> k), '{}'::jsonb) INTO v_old_key
                    FROM pg_catalog.unnest(v_key) AS k;
                END IF;
                IF TG_OP <> 'DELETE' THEN
                    v_new := pg_catalog.to_jsonb(NEW);
                    SELECT coalesce(pg_catalog.jsonb_object_agg(k, v_new -> k), '{}'::jsonb) INTO v_new_key
                    FROM pg_catalog.unnest(v_key) AS k;
                END IF;
                IF TG_OP = 'INSERT' THEN
                    INSERT INTO wormhole.store_changes (grp, store, xid, tbl, op, pk, first)
                    VALUES (v_grp, v_store, v_xid, v_table, 'i', v_new_key, v_first);
                ELSIF TG_OP = 'DELETE' THEN
                    INSERT INTO wormhole.store_changes (grp, store, xid, tbl, op, pk, first)
                    VALUES (v_grp, v_store, v_xid, v_table, 'd', v_old_key, v_first);
                ELSIF v_old_key = v_new_key THEN
                    INSERT INTO wormhole.store_changes (grp, store, xid, tbl, op, pk, first)
                    VALUES (v_grp, v_store, v_xid, v_table, 'u', v_new_key, v_first);
                ELSE
                    -- A key that changed: the old row went and a new one came.
                    INSERT INTO wormhole.store_changes (grp, store, xid, tbl, op, pk, first)
                    VALUES (v_grp, v_store, v_xid, v_table, 'd', v_old_key, v_first),
                        (v_grp, v_store, v_xid, v_table, 'i', v_new_key, false);
                END IF;
                RETURN NULL;
            END
            $$
            """,
            // At commit (a deferred constraint trigger, queued by a transaction's first change of the store), the
            // transaction takes the next id of its store, under the lock of the store's row that it keeps until the
            // commit ends, is recorded with its author (the session's `wormhole.author`, which a store's connections
            // set when they open; `external` for any other session: psql, another service), and notifies the
            // group's channel. Written once, never updated: no dead row per transaction.
            """
            CREATE FUNCTION wormhole.store_commit() RETURNS trigger
            LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                v_id bigint;
                v_channel text;
            BEGIN
                UPDATE wormhole.stores s SET last_id = s.last_id + 1
                WHERE s.grp = NEW.grp AND s.store = NEW.store
                RETURNING s.last_id INTO v_id;
                IF v_id IS NULL THEN
                    RAISE EXCEPTION 'the wormhole store % of group % is not registered', NEW.store, NEW.grp;
                END IF;
                INSERT INTO wormhole.store_transactions (grp, store, id, xid, author, committed)
                VALUES (NEW.grp, NEW.store, v_id, NEW.xid,
                    coalesce(nullif(pg_catalog.current_setting('wormhole.author', true), ''), 'external'),
                    pg_catalog.clock_timestamp());
                SELECT g.channel INTO v_channel FROM wormhole.groups g WHERE g.grp = NEW.grp;
                IF v_channel IS NOT NULL THEN
                    PERFORM pg_catalog.pg_notify(v_channel, 'nstore.' || NEW.store);
                END IF;
                RETURN NULL;
            END
            $$
            """,
            """
            CREATE CONSTRAINT TRIGGER store_commit_order AFTER INSERT ON wormhole.store_changes
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.first) EXECUTE FUNCTION wormhole.store_commit()
            """,
            // Gives every table of `p_schema` but `p_untracked` the row trigger (with `p_replace`, again where it
            // is; else only where it is missing). A table whose trigger records for another store is refused: two
            // stores on one schema would take each other's tables. Names are quoted by format's %I and %L, never
            // by the client.
            """
            CREATE FUNCTION wormhole.store_track(
                p_grp text, p_store text, p_schema text, p_untracked text[], p_replace boolean
            ) RETURNS integer LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                r record;
                v_owner text[];
                v_key text[];
                v_count integer := 0;
            BEGIN
                FOR r IN
                    SELECT c.oid, c.relname::text AS name FROM pg_catalog.pg_class c
                    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = p_schema AND c.relkind IN ('r', 'p') AND NOT c.relispartition
                        AND NOT (c.relname::text = ANY (p_untracked))
                    ORDER BY c.relname
                LOOP
                    SELECT pg_catalog.string_to_array(pg_catalog.encode(t.tgargs, 'escape'), '\\000') INTO v_owner
                    FROM pg_catalog.pg_trigger t
                    WHERE t.tgrelid = r.oid AND t.tgname = 'wormhole_history';
                    IF v_owner IS NOT NULL AND (v_owner[1] <> p_grp OR v_owner[2] <> p_store) THEN
                        RAISE EXCEPTION 'the table %.% is tracked by the store % of group %: give each store a '
                            'schema of its own', p_schema, r.name, v_owner[2], v_owner[1]
                            USING ERRCODE = 'unique_violation';
                    END IF;
                    IF p_replace OR v_owner IS NULL THEN
                        SELECT coalesce(pg_catalog.array_agg(a.attname::text ORDER BY k.ord), '{}') INTO v_key
                        FROM pg_catalog.pg_index i
                        CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                        JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                        WHERE i.indrelid = r.oid AND i.indisprimary;
                        EXECUTE pg_catalog.format(
                            'CREATE OR REPLACE TRIGGER wormhole_history AFTER INSERT OR UPDATE OR DELETE ON %I.%I '
                                || 'FOR EACH ROW EXECUTE FUNCTION wormhole.store_record(%L, %L, %L, %L)',
                            p_schema, r.name, p_grp, p_store, v_key::text, r.name);
                    END IF;
                    v_count := v_count + 1;
                END LOOP;
                RETURN v_count;
            END
            $$
            """,
            // A consumer's read: the transactions after `p_after`, at most `p_limit`, each with its changes in order
            // (one row with an empty table for a transaction without any). A function, so that each session plans it
            // once; the changes are read transaction by transaction, each lookup on the whole primary key prefix
            // (a join let the planner scan every change of the store while the tables had no statistics yet).
            """
            CREATE FUNCTION wormhole.store_read(p_grp text, p_store text, p_after bigint, p_limit bigint)
            RETURNS TABLE (id bigint, author text, committed double precision, tbl text, op text, pk text, seq bigint)
            LANGUAGE plpgsql STABLE SECURITY INVOKER AS $$
            DECLARE
                t record;
            BEGIN
                FOR t IN
                    SELECT s.id, s.xid, s.author, extract(epoch FROM s.committed)::double precision AS committed
                    FROM wormhole.store_transactions s
                    WHERE s.grp = p_grp AND s.store = p_store AND s.id > p_after
                    ORDER BY s.id LIMIT p_limit
                LOOP
                    RETURN QUERY
                        SELECT t.id, t.author, t.committed, x.tbl, x.op, x.pk::text, x.seq
                        FROM wormhole.store_changes x
                        WHERE x.grp = p_grp AND x.store = p_store AND x.xid = t.xid
                        ORDER BY x.seq;
                    IF NOT FOUND THEN
                        RETURN QUERY SELECT t.id, t.author, t.committed, ''::text, ''::text, ''::text, 0::bigint;
                    END IF;
                END LOOP;
            END
            $$
            """,
            // Deletes consumers not seen for `p_maximum_age` seconds, then the history every consumer left has
            // merged, or older than `p_maximum_age`, whichever reaches further. Returns the transactions deleted.
            """
            CREATE FUNCTION wormhole.store_purge(p_grp text, p_store text, p_maximum_age double precision)
            RETURNS bigint LANGUAGE plpgsql SECURITY INVOKER AS $$
            DECLARE
                v_cutoff timestamptz := pg_catalog.now() - pg_catalog.make_interval(secs => p_maximum_age);
                v_merged bigint;
                v_old bigint;
                v_count bigint;
            BEGIN
                DELETE FROM wormhole.store_consumers c
                WHERE c.grp = p_grp AND c.store = p_store AND c.seen < v_cutoff;
                SELECT pg_catalog.min(c.token) INTO v_merged FROM wormhole.store_consumers c
                WHERE c.grp = p_grp AND c.store = p_store;
                SELECT pg_catalog.max(t.id) INTO v_old FROM wormhole.store_transactions t
                WHERE t.grp = p_grp AND t.store = p_store AND t.committed < v_cutoff;
                WITH gone AS (
                    DELETE FROM wormhole.store_transactions t
                    WHERE t.grp = p_grp AND t.store = p_store
                        AND t.id <= greatest(coalesce(v_merged, 0), coalesce(v_old, 0))
                    RETURNING t.xid),
                changes AS (
                    DELETE FROM wormhole.store_changes c USING gone
                    WHERE c.grp = p_grp AND c.store = p_store AND c.xid = gone.xid)
                SELECT pg_catalog.count(*) INTO v_count FROM gone;
                RETURN v_count;
            END
            $$
            """,
        ]
        + ["stores", "store_transactions", "store_changes", "store_consumers", "store_migrations"].flatMap { table in
            [
                "ALTER TABLE wormhole.\(table) ENABLE ROW LEVEL SECURITY",
                "CREATE POLICY group_members ON wormhole.\(table) USING (wormhole.may_use(grp)) "
                    + "WITH CHECK (wormhole.may_use(grp))",
            ]
        }

    /// Migration 4: the purge keeps what every registered consumer has merged for ``PostgresStore/mergedHistoryGrace``
    /// (30 s) more, for passing consumers (`consumer: nil`), which no table lists: migration 3's purge deleted it at
    /// once, and a passing observer in another process that had not read it yet missed those transactions. The
    /// function keeps its signature, so that every caller gets the fix. It finds the last transaction committed
    /// before a time by bisecting ids (`wormhole.store_last_before`): `max(id) … WHERE committed < …` read every
    /// transaction newer than that time, the whole maximum age of them while a registered consumer is away.
    static let graceMigration: [String] = [
        // Commit times rise with ids: both are taken at commit under the lock of the store's row (`store_commit`).
        // So the first transaction committed at `p_time` or later is found in about log2(n) lookups on the primary
        // key. With times that do not rise (a server clock set back), the answer is one committed before `p_time`,
        // never a later one than the scan's.
        """
        CREATE FUNCTION wormhole.store_last_before(p_grp text, p_store text, p_time timestamptz)
        RETURNS bigint LANGUAGE plpgsql STABLE SECURITY INVOKER AS $$
        DECLARE
            v_low bigint;
            v_high bigint;
            v_middle bigint;
            v_found bigint;
            v_committed timestamptz;
        BEGIN
            SELECT pg_catalog.min(t.id), pg_catalog.max(t.id) + 1 INTO v_low, v_high
            FROM wormhole.store_transactions t
            WHERE t.grp = p_grp AND t.store = p_store;
            IF v_low IS NULL THEN
                RETURN 0;
            END IF;
            -- Transactions below v_low were committed before p_time; the first from v_high on, if any, was not.
            WHILE v_low < v_high LOOP
                v_middle := v_low + (v_high - v_low) / 2;
                SELECT t.id, t.committed INTO v_found, v_committed FROM wormhole.store_transactions t
                WHERE t.grp = p_grp AND t.store = p_store AND t.id >= v_middle
                ORDER BY t.id LIMIT 1;
                IF v_found IS NOT NULL AND v_committed < p_time THEN
                    v_low := v_found + 1;
                ELSE
                    v_high := v_middle;
                END IF;
            END LOOP;
            SELECT pg_catalog.max(t.id) INTO v_found FROM wormhole.store_transactions t
            WHERE t.grp = p_grp AND t.store = p_store AND t.id < v_low;
            RETURN coalesce(v_found, 0);
        END
        $$
        """,
        """
        CREATE OR REPLACE FUNCTION wormhole.store_purge(p_grp text, p_store text, p_maximum_age double precision)
        RETURNS bigint LANGUAGE plpgsql SECURITY INVOKER AS $$
        DECLARE
            v_cutoff timestamptz := pg_catalog.now() - pg_catalog.make_interval(secs => p_maximum_age);
            v_settled_before timestamptz := pg_catalog.now() - pg_catalog.make_interval(secs => \(mergedHistoryGrace));
            v_merged bigint;
            v_settled bigint;
            v_old bigint;
            v_count bigint;
        BEGIN
            DELETE FROM wormhole.store_consumers c
            WHERE c.grp = p_grp AND c.store = p_store AND c.seen < v_cutoff;
            SELECT pg_catalog.min(c.token) INTO v_merged FROM wormhole.store_consumers c
            WHERE c.grp = p_grp AND c.store = p_store;
            -- Merged, but not the last seconds of it: passing consumers may not have read it yet.
            v_settled := wormhole.store_last_before(p_grp, p_store, v_settled_before);
            v_old := wormhole.store_last_before(p_grp, p_store, v_cutoff);
            WITH gone AS (
                DELETE FROM wormhole.store_transactions t
                WHERE t.grp = p_grp AND t.store = p_store
                    AND t.id <= greatest(least(coalesce(v_merged, 0), coalesce(v_settled, 0)), coalesce(v_old, 0))
                RETURNING t.xid),
            changes AS (
                DELETE FROM wormhole.store_changes c USING gone
                WHERE c.grp = p_grp AND c.store = p_store AND c.xid = gone.xid)
            SELECT pg_catalog.count(*) INTO v_count FROM gone;
            RETURN v_count;
        END
        $$
        """,
    ]

    /// Seconds of ``PostgresStore/mergedHistoryGrace``, as migration 4 writes them into the purge: a literal, not
    /// derived from that constant, since a migration's text must never change once it shipped.
    private static let mergedHistoryGrace = 30

    /// Part of migration 7: reads bounded by changes, not only by transactions. `store_read` returned every change
    /// of up to `p_limit` transactions in one statement, so a few large transactions came back whole into memory and
    /// could pass the engine's time-out on every retry. `store_read_bounded` stops once it returned `p_change_limit`
    /// rows (within a transaction if need be), and leaves out the changes of tables the consumer does not follow;
    /// `store_read_changes` reads the rest of a transaction that was cut, one page at a time.
    static let boundedReadMigration: [String] = [
        // Rows as `store_read`'s. A transaction with no change in `p_tables` (null: every table) gives one row with
        // an empty table; a transaction may be cut after any row once `p_change_limit` rows were returned.
        """
        CREATE FUNCTION wormhole.store_read_bounded(p_grp text, p_store text, p_after bigint, p_limit bigint,
            p_change_limit bigint, p_tables text[])
        RETURNS TABLE (id bigint, author text, committed double precision, tbl text, op text, pk text, seq bigint)
        LANGUAGE plpgsql STABLE SECURITY INVOKER AS $$
        DECLARE
            t record;
            v_left bigint := greatest(p_change_limit, 1);
            v_count bigint;
        BEGIN
            FOR t IN
                SELECT s.id, s.xid, s.author, extract(epoch FROM s.committed)::double precision AS committed
                FROM wormhole.store_transactions s
                WHERE s.grp = p_grp AND s.store = p_store AND s.id > p_after
                ORDER BY s.id LIMIT p_limit
            LOOP
                EXIT WHEN v_left <= 0;
                RETURN QUERY
                    SELECT t.id, t.author, t.committed, x.tbl, x.op, x.pk::text, x.seq
                    FROM wormhole.store_changes x
                    WHERE x.grp = p_grp AND x.store = p_store AND x.xid = t.xid
                        AND (p_tables IS NULL OR x.tbl = ANY (p_tables))
                    ORDER BY x.seq LIMIT v_left;
                GET DIAGNOSTICS v_count = ROW_COUNT;
                IF v_count = 0 THEN
                    RETURN QUERY SELECT t.id, t.author, t.committed, ''::text, ''::text, ''::text, 0::bigint;
                    v_count := 1;
                END IF;
                v_left := v_left - v_count;
            END LOOP;
        END
        $$
        """,
        // The changes of transaction `p_id` after the change `p_after_seq`, at most `p_limit`, as `tbl, op, pk, seq`.
        // A transaction purged since the read began raises (SQLSTATE P0002), so that it is never handed over cut:
        // the reader's next read finds it gone, as any purged transaction.
        """
        CREATE FUNCTION wormhole.store_read_changes(p_grp text, p_store text, p_id bigint, p_after_seq bigint,
            p_limit bigint, p_tables text[])
        RETURNS TABLE (tbl text, op text, pk text, seq bigint)
        LANGUAGE plpgsql STABLE SECURITY INVOKER AS $$
        DECLARE
            v_xid xid8;
        BEGIN
            SELECT s.xid INTO v_xid FROM wormhole.store_transactions s
            WHERE s.grp = p_grp AND s.store = p_store AND s.id = p_id;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'the transaction % of the store % was purged while it was read', p_id, p_store
                    USING ERRCODE = 'P0002';
            END IF;
            RETURN QUERY
                SELECT x.tbl, x.op, x.pk::text, x.seq
                FROM wormhole.store_changes x
                WHERE x.grp = p_grp AND x.store = p_store AND x.xid = v_xid AND x.seq > p_after_seq
                    AND (p_tables IS NULL OR x.tbl = ANY (p_tables))
                ORDER BY x.seq LIMIT p_limit;
        END
        $$
        """,
    ]

    /// The tables a role granted a group may read and write for its stores.
    static let grantedTables =
        "wormhole.stores, wormhole.store_transactions, wormhole.store_changes, wormhole.store_consumers, "
        + "wormhole.store_migrations"
}
