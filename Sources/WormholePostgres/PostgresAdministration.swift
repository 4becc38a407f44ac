import Foundation
import Logging
import PostgresNIO
import WormholeKit

/// What an administrator does to a database that wormholes share: set up the schema, grant a role a group, and look
/// at groups, queues and live endpoints. The tool's `wormhole postgres` commands call it.
///
/// ```swift
/// let administration = try PostgresAdministration(url: "postgres://admin@db.example.com/app")
/// defer { administration.close() }
/// try administration.setUp()
/// try administration.grant(group: "group.com.example.app", to: "app_workers")
/// ```
public final class PostgresAdministration: Sendable {
    let connections: Connections

    /// Connects to the server at `url` (see ``PostgresLocation``); no statement runs yet.
    public init(url: String, logger: Logger = Logger(label: "wormhole.postgres")) throws(WormholeError) {
        connections = Connections(
            source: .location(try PostgresLocation(url: url)),
            timeout: .seconds(60),
            logger: logger
        )
    }

    /// Runs the migrations the database lacks, under a lock; running it again does nothing.
    ///
    /// - Returns: The schema's version before and after.
    @discardableResult
    public func setUp() throws(WormholeError) -> (before: Int, after: Int) {
        let before = try Schema.currentVersion(connections)
        let after = try Schema.migrate(connections)
        return (before, after)
    }

    /// The schema's version: 0 before ``setUp()``.
    public func schemaVersion() throws(WormholeError) -> Int { try Schema.currentVersion(connections) }

    /// Lets `role` (and its members) use `group`, and only the groups granted to it: row-level security hides the
    /// rows of every other group from a role that does not own the tables.
    ///
    /// - Throws: `WormholeError.Code.serverRejected` when the role does not exist or this user may not grant.
    public func grant(group: String, to role: String) throws(WormholeError) {
        try GroupName.validate(group)
        let what = "granting \(group) to \(role)"
        try connections.transaction(doing: what) { (connection) throws(WormholeError) in
            // One grant at a time, as migrations run: two `GRANT`s on the schema at once fail ("tuple concurrently
            // updated", XX000), as two administrators or test runs granting together found.
            try connections.run(
                "SELECT pg_advisory_xact_lock(\(Schema.lockKey))",
                on: connection,
                doing: "waiting for other grants"
            )
            // The role's name quoted by the server, never by us.
            let rows = try connections.run(
                "SELECT quote_ident(rolname) FROM pg_roles WHERE rolname = \(role)",
                on: connection,
                doing: what
            )
            guard let row = rows.first else {
                throw WormholeError(.serverRejected, "There is no role \(role) on this server: create it first.")
            }
            let quoted = try decode(String.self, row, doing: what)
            for statement in [
                "GRANT USAGE ON SCHEMA wormhole TO \(quoted)",
                """
                GRANT SELECT, INSERT, UPDATE, DELETE ON wormhole.mailboxes, wormhole.queues, wormhole.queue_records,
                    wormhole.queue_consumers, wormhole.suites, wormhole.suite_values, wormhole.suite_changes,
                    wormhole.live_endpoints, wormhole.live_bodies, wormhole.transfers, wormhole.transfer_chunks
                    TO \(quoted)
                """,
                "GRANT SELECT, INSERT, UPDATE, DELETE ON \(StoreSchema.grantedTables) TO \(quoted)",
                "GRANT SELECT, INSERT ON wormhole.groups TO \(quoted)",
                "GRANT SELECT ON wormhole.schema_migrations, wormhole.group_roles TO \(quoted)",
            ] {
                try connections.run(PostgresQuery(unsafeSQL: statement), on: connection, doing: what)
            }
            try connections.run(
                """
                INSERT INTO wormhole.groups (grp, channel)
                VALUES (\(group), 'wormhole_' || md5(gen_random_uuid()::text || clock_timestamp()::text))
                ON CONFLICT (grp) DO NOTHING
                """,
                on: connection,
                doing: what
            )
            // By OID (schema version 5): a role of that name made again after one was dropped is another role,
            // which this grant, made anew, now names.
            try connections.run(
                """
                INSERT INTO wormhole.group_roles (grp, role, role_oid)
                SELECT \(group), rolname, oid FROM pg_catalog.pg_roles WHERE rolname = \(role)
                ON CONFLICT (grp, role) DO UPDATE SET role_oid = EXCLUDED.role_oid
                """,
                on: connection,
                doing: what
            )
        }
    }

    /// Takes `group` from `role` (granted by ``grant(group:to:)``), and rotates the group's channel and key
    /// (``rotate(group:)``), so that the role's processes, which knew both, hear and seal nothing of the group's
    /// from now on.
    ///
    /// The role's live endpoints in the group are removed (a request is never sent to them again), as is the
    /// endpoint of any session whose user may no longer use the group. The role keeps its privileges on the tables,
    /// which it may need for other groups; row-level security hides this group's rows from it.
    ///
    /// - Parameters:
    ///   - group: The group.
    ///   - role: The role's name; for a role that was dropped, the name it had.
    /// - Returns: Whether a grant was removed.
    /// - Throws: `WormholeError.Code.serverRejected` when there is no such group or this user may not change it.
    @discardableResult
    public func revoke(group: String, from role: String) throws(WormholeError) -> Bool {
        try GroupName.validate(group)
        let what = "revoking \(group) from \(role)"
        return try connections.transaction(doing: what) { (connection) throws(WormholeError) -> Bool in
            let removed = try connections.run(
                "DELETE FROM wormhole.group_roles WHERE grp = \(group) AND role = \(role) RETURNING 1",
                on: connection,
                doing: what
            )
            // Endpoints of sessions whose user is no longer a member of any role granted the group.
            try connections.run(
                """
                DELETE FROM wormhole.live_endpoints e WHERE e.grp = \(group) AND EXISTS (
                    SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = e.backend_pid
                        AND NOT EXISTS (SELECT 1 FROM wormhole.group_roles r WHERE r.grp = e.grp
                            AND pg_catalog.pg_has_role(a.usesysid, r.role_oid, 'MEMBER')))
                """,
                on: connection,
                doing: what
            )
            try rotate(group: group, on: connection, doing: what)
            return !removed.isEmpty
        }
    }

    /// Gives `group` a new notification channel and a new key, as after a leak of either: the group's running
    /// processes move to the new channel by themselves (a hint on the old one tells them; each then listens anew and
    /// reads again what came meanwhile), and whoever knew only the old ones hears nothing more and can seal nothing.
    ///
    /// A live message or request sent in the moment of the move may be lost, as during a reconnection; mailboxes,
    /// queues, suites and stores lose nothing.
    ///
    /// - Throws: `WormholeError.Code.serverRejected` when there is no such group or this user may not change it.
    public func rotate(group: String) throws(WormholeError) {
        try GroupName.validate(group)
        let what = "rotating the channel of \(group)"
        try connections.transaction(doing: what) { (connection) throws(WormholeError) in
            try rotate(group: group, on: connection, doing: what)
        }
    }

    /// The rotation, in the caller's transaction: the row locked, a new channel and key (`wormhole.fill_group_key`
    /// makes the key when it is set to null), and the hint `r` on the old channel, sent at the commit.
    private func rotate(group: String, on connection: PostgresConnection, doing what: String) throws(WormholeError) {
        let old = try connections.run(
            "SELECT channel FROM wormhole.groups WHERE grp = \(group) FOR UPDATE",
            on: connection,
            doing: what
        )
        guard let row = old.first else {
            throw WormholeError(
                .serverRejected,
                "There is no group \(group) on this server, or this role cannot see it."
            )
        }
        let channel = try decode(String.self, row, doing: what)
        try connections.run(
            """
            UPDATE wormhole.groups
            SET channel = 'wormhole_' || md5(gen_random_uuid()::text || clock_timestamp()::text), key_inner = NULL
            WHERE grp = \(group)
            """,
            on: connection,
            doing: what
        )
        try connections.run("SELECT pg_notify(\(channel), 'r')", on: connection, doing: what)
    }

    /// The groups this role sees, with their mailboxes, queues (and their consumers' lag) and live endpoints.
    ///
    /// - Parameter group: One group only, or every group when nil.
    public func status(group: String? = nil) throws(WormholeError) -> PostgresStatus {
        let version = try Schema.currentVersion(connections)
        guard version > 0 else { return PostgresStatus(schemaVersion: 0, groups: []) }
        let what = "reading the status"
        var groups: [PostgresStatus.Group] = []
        let names = try connections.query(
            "SELECT grp FROM wormhole.groups WHERE \(group) IS NULL OR grp = \(group) ORDER BY grp COLLATE \"C\"",
            doing: what
        )
        for row in names {
            let name = try decode(String.self, row, doing: what)
            let counts = try connections.query(
                """
                SELECT (SELECT count(*) FROM wormhole.mailboxes WHERE grp = \(name) AND payload IS NOT NULL),
                    (SELECT count(*) FROM wormhole.suites WHERE grp = \(name)),
                    (SELECT count(*) FROM wormhole.transfers WHERE grp = \(name) AND state = 'staged')
                """,
                doing: what
            )
            let (mailboxes, suites, transfers): (Int64, Int64, Int64)
            do { (mailboxes, suites, transfers) = try counts.first!.decode((Int64, Int64, Int64).self) } catch {
                throw WormholeError(.serverRejected, "Unexpected columns while \(what): \(error).")
            }
            let core = PostgresCore(
                connections: connections,
                group: name,
                logger: connections.logger,
                ownsConnections: false
            )
            var queues: [QueueStatus] = []
            for queueRow in try connections.query(
                "SELECT queue FROM wormhole.queues WHERE grp = \(name) ORDER BY queue COLLATE \"C\"",
                doing: what
            ) {
                let queue = try decode(String.self, queueRow, doing: what)
                queues.append(
                    try PostgresQueueLog(engine: core, identifier: queue, sender: "", retention: .seconds(0)).status()
                )
            }
            var endpoints: [PostgresStatus.Endpoint] = []
            for endpointRow in try connections.query(
                """
                SELECT e.identifier, e.kind,
                    coalesce(e.alive_key IS NOT NULL AND NOT pg_try_advisory_xact_lock_shared(e.alive_key), false)
                FROM wormhole.live_endpoints e WHERE e.grp = \(name) ORDER BY e.identifier COLLATE "C", e.kind
                """,
                doing: what
            ) {
                do {
                    let (identifier, kind, alive) = try endpointRow.decode((String, String, Bool).self)
                    endpoints.append(PostgresStatus.Endpoint(identifier: identifier, kind: kind, isAlive: alive))
                } catch {
                    throw WormholeError(.serverRejected, "Unexpected columns while \(what): \(error).")
                }
            }
            // Grants whose role was dropped: they grant nothing (by OID, schema version 5), and say who had it.
            var gone: [String] = []
            for grantRow in try connections.query(
                """
                SELECT r.role::text FROM wormhole.group_roles r
                WHERE r.grp = \(name) AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles a WHERE a.oid = r.role_oid)
                ORDER BY r.role
                """,
                doing: what
            ) {
                gone.append(try decode(String.self, grantRow, doing: what))
            }
            groups.append(
                PostgresStatus.Group(
                    name: name,
                    mailboxes: Int(clamping: mailboxes),
                    suites: Int(clamping: suites),
                    stagedTransfers: Int(clamping: transfers),
                    queues: queues,
                    liveEndpoints: endpoints,
                    grantsOfDroppedRoles: gone
                )
            )
        }
        return PostgresStatus(schemaVersion: version, groups: groups)
    }

    /// Closes the connections.
    public func close() { connections.close() }

    deinit { close() }
}

/// What ``PostgresAdministration/status(group:)`` reports.
public struct PostgresStatus: Sendable, Codable, Equatable {
    /// A live endpoint: a process listening for live messages or answering requests.
    public struct Endpoint: Sendable, Codable, Equatable {
        /// Its identifier.
        public var identifier: String
        /// `listen` or `respond`.
        public var kind: String
        /// Whether its process's connection is alive (a row of a process that died stays until it is swept).
        public var isAlive: Bool
    }

    /// A group.
    public struct Group: Sendable, Codable, Equatable {
        /// Its name.
        public var name: String
        /// How many mailboxes hold a message.
        public var mailboxes: Int
        /// How many suites it has.
        public var suites: Int
        /// How many files are sent and not yet received.
        public var stagedTransfers: Int
        /// Its queues, each with its consumers' lag.
        public var queues: [QueueStatus]
        /// Its live endpoints.
        public var liveEndpoints: [Endpoint]
        /// The roles granted the group that no longer exist: their grants grant nothing, not even to a new role of
        /// the same name. Only the tables' owner sees every grant; another role sees its own.
        public var grantsOfDroppedRoles: [String]
    }

    /// The schema's version: 0 when it was never set up.
    public var schemaVersion: Int
    /// The groups the role sees.
    public var groups: [Group]
}
