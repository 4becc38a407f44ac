import Foundation
import PostgresNIO
import Testing
import WormholeCLI
import WormholeKit

@testable import WormholePostgres

/// What the PostgreSQL engine does when another holder of the group's rights (or of none) does not behave: rows
/// written by hand are checked before use, a transfer's row cannot hand over a file outside its destination, a
/// dropped role breaks no group, and a URL means what libpq makes of it.
@Suite(
    "PostgreSQL engine: hostile and stuck peers",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .serialized,
    .limit(minutes: 3)
)
struct PostgresHostilePeerTests {
    // MARK: Rows written by hand

    @Test("Numbers no writer of this package writes give a typed error naming the row, never a trap")
    func craftedNumbers() async throws { try await offThePool { try craftedNumbersBody() } }

    func craftedNumbersBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("crafted")
        let engine = try PostgresEngine(url: server.url, group: group)
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "member")
        func update(_ sql: String) throws { _ = try server.psql(sql + " AND grp = '\(group)'") }

        // A mailbox whose sequence was set negative: a trap before, now an error for that mailbox only.
        try wormhole.passMessageObject("kept", identifier: "box")
        try wormhole.passMessageObject("other", identifier: "other")
        try update("UPDATE wormhole.mailboxes SET sequence = -7 WHERE identifier = 'box'")
        let mailbox = wormholeError { _ = try wormhole.message(withIdentifier: "box", as: String.self) }
        #expect(mailbox?.code == .corruptMessage, "\(String(describing: mailbox))")
        #expect(mailbox?.message.contains("wormhole.mailboxes") == true, "\(String(describing: mailbox))")
        #expect(mailbox?.message.contains("sequence = -7") == true, "\(String(describing: mailbox))")
        #expect(try wormhole.message(withIdentifier: "other", as: String.self) == "other", "the rest is served")
        // At the end of bigint's range, where one more would not fit: refused too.
        try update("UPDATE wormhole.mailboxes SET sequence = 9223372036854775807 WHERE identifier = 'box'")
        #expect(wormholeError { _ = try wormhole.messageData(withIdentifier: "box") }?.code == .corruptMessage)

        // A queue consumer's position set negative: opening and reading it are refused.
        let queue = try wormhole.queue("jobs")
        try queue.enqueue("first")
        try queue.enqueue("second")
        let cursor = try queue.log.openCursor(consumer: "worker")
        try update("UPDATE wormhole.queue_consumers SET position = -3 WHERE queue = 'jobs'")
        let position = wormholeError { _ = try cursor.read(maximumCount: 10) }
        #expect(position?.code == .corruptMessage, "\(String(describing: position))")
        #expect(position?.message.contains("queue_consumers") == true, "\(String(describing: position))")
        #expect(wormholeError { _ = try queue.log.openCursor(consumer: "worker") }?.code == .corruptMessage)
        let status = wormholeError { _ = try queue.status() }
        #expect(status?.code == .corruptMessage, "\(String(describing: status))")
        try update("UPDATE wormhole.queue_consumers SET position = 0 WHERE queue = 'jobs'")

        // A record moved to the last offset: acknowledging one past it would not fit in a bigint.
        try update("UPDATE wormhole.queue_records SET \"offset\" = 9223372036854775807 WHERE \"offset\" = 1")
        let record = wormholeError { _ = try queue.log.openCursor(consumer: "worker").read(maximumCount: 10) }
        #expect(record?.code == .corruptMessage, "\(String(describing: record))")
        #expect(record?.message.contains("queue_records") == true, "\(String(describing: record))")
        // A consumer that handles records reports it and stops on it, without a trap; the first record came.
        let handled = Collector<String>()
        let errors = Collector<WormholeError>()
        let consumer = try queue.consume(consumer: "handler", as: String.self, errorHandler: { errors.append($0) }) {
            handled.append($0.value)
        }
        #expect(eventually { errors.count >= 1 })
        consumer.cancel()
        #expect(errors.values.first?.code == .corruptMessage, "\(errors.values)")

        // A suite's version set negative, and a change whose values name keys it did not change.
        let suite = try wormhole.suite("settings")
        try suite.set("dark", forKey: "theme")
        try suite.set(2, forKey: "size")
        try update("UPDATE wormhole.suites SET version = -1 WHERE suite = 'settings'")
        let version = wormholeError { _ = try suite.value(forKey: "theme", as: String.self) }
        #expect(version?.code == .corruptMessage, "\(String(describing: version))")
        #expect(version?.message.contains("wormhole.suites") == true, "\(String(describing: version))")
        try update("UPDATE wormhole.suites SET version = 2 WHERE suite = 'settings'")
        #expect(try suite.value(forKey: "theme", as: String.self) == "dark")
        try update(
            "UPDATE wormhole.suite_changes SET set_keys = ARRAY['forged'], set_values = ARRAY['1'] WHERE version = 2"
        )
        let change = wormholeError { _ = try suite.store.changes(after: 0) }
        #expect(change?.code == .corruptMessage, "\(String(describing: change))")
        #expect(change?.message.contains("suite_changes") == true, "\(String(describing: change))")
    }

    @Test("The tool reading a crafted mailbox row fails with a message, not a signal")
    func craftedRowThroughTheTool() async throws { try await offThePool { try craftedRowThroughTheToolBody() } }

    func craftedRowThroughTheToolBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("crafted-tool")
        let engine = try PostgresEngine(url: server.url, group: group)
        defer { engine.close() }
        try Wormhole(engine: engine, sender: "member").passMessageObject("kept", identifier: "box")
        _ = try server.psql("UPDATE wormhole.mailboxes SET sequence = -7 WHERE grp = '\(group)'")
        let tool = try WormholeTool.run(["read", "box", "--postgres", server.url, "--group", group], timeout: 60)
        // 1 is the tool's failure; a trap ends it by a signal (SIGILL or SIGTRAP), which is not 1.
        #expect(tool.status == 1, "exit \(tool.status): \(tool.error)")
        #expect(tool.error.contains("sequence = -7"), "\(tool.error)")
    }

    // MARK: Notifications

    /// A group's channel, as its row names it now.
    static func channel(of group: String, _ server: LocalPostgresServer) throws -> String {
        try server.psql("SELECT channel FROM wormhole.groups WHERE grp = '\(group)'")
    }

    /// `text` as an SQL string literal.
    static func literal(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "''") + "'" }

    /// What `psql` printed of the notifications it heard, in order: each one's payload.
    static func heard(_ output: String) -> [String] {
        let start = "with payload \""
        let end = "\" received from server process with PID"
        return output.split(separator: "\n").compactMap { line in
            guard line.hasPrefix("Asynchronous notification"), let from = line.range(of: start),
                let to = line.range(of: end, options: .backwards), from.upperBound <= to.lowerBound
            else { return nil }
            return String(line[from.upperBound..<to.lowerBound])
        }
    }

    /// Role one's wormhole on group A, with a consumer `worker` of its queue `jobs` that collects what it handles:
    /// the setting of the notification tests. ``close()`` stops the consumer, then the engine.
    struct JobsOfGroupA {
        let engine: PostgresEngine
        let wormhole: Wormhole
        let queue: WormholeQueue
        let handled = Collector<String>()
        let consumer: QueueConsumer

        init(_ roles: GrantedRoles) throws {
            engine = try roles.engine(roles.one, roles.groupA)
            wormhole = Wormhole(engine: engine, sender: "one")
            do {
                queue = try wormhole.queue("jobs")
                let handled = handled
                consumer = try queue.consume(consumer: "worker", as: String.self) { handled.append($0.value) }
            } catch {
                engine.close()
                throw error
            }
        }

        func close() {
            consumer.cancel()
            engine.close()
        }
    }

    /// Has role one, a member of group A, seal from its own backend what an append of `texts` (as JSON strings) to
    /// the queue `jobs` at `offset` would carry: a forgery only the acknowledgement's check can catch.
    static func sealAsMember(_ texts: [String], at offset: UInt64, _ roles: GrantedRoles) throws {
        let notification = CarriedAppend(
            identifier: "jobs",
            firstOffset: offset,
            sender: "forger",
            timestampNanoseconds: 0,
            payloads: texts.map { Data("\"\($0)\"".utf8) }
        ).notification
        try roles.server.psql(
            "SELECT wormhole.notify_sealed(\(literal(roles.groupA)), '', \(literal(notification)))",
            user: roles.one
        )
    }

    @Test("Forged queue and live notifications from a role of another group deliver nothing and skip no record")
    func forgedNotifications() async throws { try await offThePool { try forgedNotificationsBody() } }

    func forgedNotificationsBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "forged")
        defer { roles.close() }
        let jobs = try JobsOfGroupA(roles)
        defer { jobs.close() }
        let (engine, wormhole, queue, handled) = (jobs.engine, jobs.wormhole, jobs.queue, jobs.handled)
        let ticks = Collector<String>()
        let listener = try wormhole.listenForLiveMessages(withIdentifier: "ticks", as: String.self) { ticks.append($0) }
        defer { listener.cancel() }
        try queue.enqueue("real 0")
        #expect(eventually { handled.values == ["real 0"] })

        // Role two, of group B only, given the channel's name (a member since removed, a leaked log line), sends
        // what an append of "forged" at offset 1 would carry, unsealed and with a seal of its own making, and a
        // live message.
        let channel = try Self.channel(of: roles.groupA, server)
        let forgedRecord = CarriedAppend(
            identifier: "jobs",
            firstOffset: 1,
            sender: "forger",
            timestampNanoseconds: 0,
            payloads: [Data("\"forged\"".utf8)]
        ).notification
        var forgedTick = LiveEnvelope(kind: .message, identifier: "ticks")
        forgedTick.sender = "forger"
        forgedTick.body = Data("\"forged\"".utf8).base64EncodedString()
        let fakeSeal = "~1:1:" + Data(count: 32).base64EncodedString()
        for text in [forgedRecord, forgedRecord + fakeSeal] {
            try server.psql("SELECT pg_notify(\(Self.literal(channel)), \(Self.literal(text)))", user: roles.two)
        }
        let liveChannel = channel + NotificationHub.liveSuffix(for: "ticks")
        for text in [forgedTick.notification, forgedTick.notification + fakeSeal] {
            try server.psql("SELECT pg_notify(\(Self.literal(liveChannel)), \(Self.literal(text)))", user: roles.two)
        }
        #expect(eventually { engine.core.hub.refused.load(ordering: .relaxed) >= 4 }, "the forgeries were heard")

        // The real records come, every one, and the live message sent after the forgery.
        try queue.enqueue("real 1")
        try queue.enqueue("real 2")
        #expect(try wormhole.sendMessage("real", identifier: "ticks") == 1)
        #expect(eventually { handled.values.count >= 3 && ticks.values.count >= 1 })
        #expect(handled.values == ["real 0", "real 1", "real 2"], "a forgery was handled, or a record skipped")
        #expect(ticks.values == ["real"])
    }

    @Test("A member's own sealed queue notification skips no record: the acknowledgement checks what it carried")
    func memberForgedRecord() async throws { try await offThePool { try memberForgedRecordBody() } }

    func memberForgedRecordBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "member-forged")
        defer { roles.close() }
        let jobs = try JobsOfGroupA(roles)
        defer { jobs.close() }
        let (engine, queue, handled, consumer) = (jobs.engine, jobs.queue, jobs.handled, jobs.consumer)
        try queue.enqueue("real 0")
        #expect(eventually { handled.values == ["real 0"] })

        // A member holds the group's key and may call the function that seals: it sends, sealed by the server from
        // its own backend, what an append at offset 1 would carry, before any record 1 exists, then one for offset
        // 2 while record 1 is there.
        func forge(_ text: String, at offset: UInt64) throws { try Self.sealAsMember([text], at: offset, roles) }
        let refusedBefore = engine.core.hub.refused.load(ordering: .relaxed)
        try forge("forged 1", at: 1)
        #expect(eventually { engine.core.hub.refused.load(ordering: .relaxed) > refusedBefore })
        #expect(eventually { handled.values.count == 2 })
        #expect(consumer.position == 1, "the forged record's acknowledgement moved the position")
        #expect(try queue.status().consumers.first { $0.name == "worker" }?.offset == 1)
        try queue.enqueue("real 1")
        #expect(eventually { handled.values.count >= 3 })
        // Record 2 is there, written by the member without a notification (so the consumer has not read it), when
        // the member's forgery for offset 2 comes: its acknowledgement is refused, and the real record 2 is read.
        try server.psql(
            """
            WITH head AS (UPDATE wormhole.queues SET next_offset = next_offset + 1
                WHERE grp = \(Self.literal(roles.groupA)) AND queue = 'jobs' RETURNING next_offset - 1 AS o)
            INSERT INTO wormhole.queue_records (grp, queue, "offset", sender, time_ns, payload)
            SELECT \(Self.literal(roles.groupA)), 'jobs', o, 'one', 0, convert_to('"real 2"', 'UTF8') FROM head
            """,
            user: roles.one
        )
        try forge("forged 2", at: 2)
        #expect(eventually { engine.core.hub.refused.load(ordering: .relaxed) > refusedBefore + 1 })
        try queue.enqueue("real 3")
        #expect(eventually { handled.values.contains("real 3") })
        // Each forgery was handled once, as any record a member appends would be; no real record was skipped.
        #expect(
            handled.values == ["real 0", "forged 1", "real 1", "forged 2", "real 2", "real 3"],
            "\(handled.values)"
        )
        #expect(eventually { (try? queue.status().consumers.first { $0.name == "worker" }?.offset) == 4 })
    }

    @Test("A member's sealed notification of several records: a batch's acknowledgement checks each, read or not")
    func memberForgedBatch() async throws { try await offThePool { try memberForgedBatchBody() } }

    func memberForgedBatchBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "member-batch")
        defer { roles.close() }
        let engine = try roles.engine(roles.one, roles.groupA)
        defer { engine.close() }
        let queue = try Wormhole(engine: engine, sender: "one").queue("jobs")
        let handled = Collector<String>()
        // Two at most a batch, so that a notification of three records leaves one carried when the batch is
        // acknowledged (the acknowledgement alone), and one of two leaves none (the acknowledgement that reads).
        let consumer = try queue.consumeBatches(consumer: "batcher", as: String.self, maximumCount: 2) { batch in
            for message in batch { handled.append(message.value) }
        }
        defer { consumer.cancel() }
        try queue.enqueue("real 0")
        #expect(eventually { handled.values == ["real 0"] })

        func forge(_ texts: [String], at offset: UInt64) throws { try Self.sealAsMember(texts, at: offset, roles) }
        let refusedBefore = engine.core.hub.refused.load(ordering: .relaxed)
        try forge(["forged 1", "forged 2", "forged 3"], at: 1)
        #expect(eventually { engine.core.hub.refused.load(ordering: .relaxed) == refusedBefore + 1 })
        #expect(eventually { handled.values.count == 3 })
        #expect(consumer.position == 1, "the forged batch's acknowledgement moved the position")
        try forge(["forged 1 again", "forged 2 again"], at: 1)
        #expect(eventually { engine.core.hub.refused.load(ordering: .relaxed) == refusedBefore + 2 })
        #expect(eventually { handled.values.count == 5 })
        #expect(consumer.position == 1, "the second forged batch's acknowledgement moved the position")
        try queue.enqueue(contentsOf: ["real 1", "real 2"])
        #expect(eventually { handled.values.count == 7 })
        // The third forged record was carried but never handed over: the refusal dropped what was carried.
        #expect(
            handled.values == [
                "real 0", "forged 1", "forged 2", "forged 1 again", "forged 2 again", "real 1", "real 2",
            ],
            "\(handled.values)"
        )
        #expect(eventually { (try? queue.status().consumers.first { $0.name == "batcher" }?.offset) == 3 })
    }

    @Test("Replayed sealed notifications, by a role of another group or by a member, deliver nothing")
    func replayedNotifications() async throws { try await offThePool { try replayedNotificationsBody() } }

    func replayedNotificationsBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "replayed")
        defer { roles.close() }
        let jobs = try JobsOfGroupA(roles)
        defer { jobs.close() }
        let (engine, wormhole, queue, handled) = (jobs.engine, jobs.wormhole, jobs.queue, jobs.handled)
        let ticks = Collector<String>()
        let listener = try wormhole.listenForLiveMessages(withIdentifier: "ticks", as: String.self) { ticks.append($0) }
        defer { listener.cancel() }

        // Role two listens on the group's channels, as one who learnt the name may, while role one sends.
        let channel = try Self.channel(of: roles.groupA, server)
        let liveChannel = channel + NotificationHub.liveSuffix(for: "ticks")
        let captured = Locked<String?>(nil)
        let capture = Thread {
            let output = try? server.psql(
                commands: ["LISTEN \"\(channel)\"", "LISTEN \"\(liveChannel)\"", "SELECT pg_sleep(2.5)", "SELECT 1"],
                user: roles.two
            )
            captured.withLock { $0 = output ?? "" }
        }
        capture.start()
        Thread.sleep(forTimeInterval: 1)
        #expect(try wormhole.sendMessage("once", identifier: "ticks") == 1)
        try queue.enqueue("job")
        #expect(eventually { ticks.values == ["once"] && handled.values == ["job"] })
        #expect(eventually { captured.withLock { $0 } != nil })
        let heard = Self.heard(captured.withLock { $0 } ?? "").filter { $0.hasPrefix("L") || $0.hasPrefix("Q") }
        #expect(heard.count == 2, "\(captured.withLock { $0 } ?? "")")
        #expect(heard.allSatisfy { $0.contains("~") }, "sealed: \(heard)")

        // Sent again as they were, by the outsider and by a member of the group, on their channels.
        let refusedBefore = engine.core.hub.refused.load(ordering: .relaxed)
        for user in [roles.two, roles.one] {
            for text in heard {
                let target = text.hasPrefix("L") ? liveChannel : channel
                try server.psql("SELECT pg_notify(\(Self.literal(target)), \(Self.literal(text)))", user: user)
            }
        }
        #expect(eventually { engine.core.hub.refused.load(ordering: .relaxed) >= refusedBefore + 2 })
        #expect(try wormhole.sendMessage("twice", identifier: "ticks") == 1)
        #expect(eventually { ticks.values.count >= 2 })
        #expect(ticks.values == ["once", "twice"], "a replay was delivered")
        #expect(handled.values == ["job"])
        capture.cancel()
    }

    @Test("Revoking a role while its processes and the group's run: the group moves to a new channel, loses nothing")
    func revokedWhileRunning() async throws { try await offThePool { try revokedWhileRunningBody() } }

    func revokedWhileRunningBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "revoked")
        defer { roles.close() }
        let third = PostgresSecurityTests.uniqueRole()
        defer { PostgresSecurityTests.dropRoles([third], on: server) }
        try server.psql("CREATE ROLE \(third) LOGIN", database: "postgres")
        try roles.administration.grant(group: roles.groupA, to: third)

        func open(_ user: String) throws -> PostgresEngine {
            try PostgresEngine(
                url: PostgresSecurityTests.url(server, user: user),
                group: roles.groupA,
                setsUpSchema: false
            )
        }
        let member = try open(roles.one)
        defer { member.close() }
        let writer = try open(roles.one)
        defer { writer.close() }
        let revoked = try open(third)
        defer { revoked.close() }
        let memberWormhole = Wormhole(engine: member, sender: "member")
        let writerWormhole = Wormhole(engine: writer, sender: "writer")
        let revokedWormhole = Wormhole(engine: revoked, sender: "revoked")

        let boxes = Collector<String>()
        let boxListener = try memberWormhole.listenForMessage(withIdentifier: "box", as: String.self) {
            boxes.append($0)
        }
        defer { boxListener.cancel() }
        let handled = Collector<Int>()
        let consumer = try memberWormhole.queue("jobs").consume(consumer: "worker", as: Int.self) {
            handled.append($0.value)
        }
        defer { consumer.cancel() }
        let ticks = Collector<String>()
        let memberTicks = try memberWormhole.listenForLiveMessages(withIdentifier: "ticks", as: String.self) {
            ticks.append($0)
        }
        defer { memberTicks.cancel() }
        let revokedTicks = Collector<String>()
        let revokedListener = try revokedWormhole.listenForLiveMessages(withIdentifier: "ticks", as: String.self) {
            revokedTicks.append($0)
        }
        defer { revokedListener.cancel() }
        #expect(try writerWormhole.sendMessage("before", identifier: "ticks") == 2)
        #expect(eventually { ticks.values == ["before"] && revokedTicks.values == ["before"] })
        let oldChannel = try Self.channel(of: roles.groupA, server)

        // Jobs flow while the grant goes; the revoked role listens on the old channel meanwhile.
        let jobs = Thread {
            for index in 0..<60 {
                try? writerWormhole.queue("jobs").enqueue(index)
                Thread.sleep(forTimeInterval: 0.01)
            }
        }
        jobs.start()
        Thread.sleep(forTimeInterval: 0.2)
        #expect(try roles.administration.revoke(group: roles.groupA, from: third))
        #expect(try !roles.administration.revoke(group: roles.groupA, from: third), "already revoked")
        let newChannel = try Self.channel(of: roles.groupA, server)
        #expect(newChannel != oldChannel && newChannel.hasPrefix("wormhole_"))
        let overheard = Locked<String?>(nil)
        let eavesdropper = Thread {
            let output = try? server.psql(
                commands: ["LISTEN \"\(oldChannel)\"", "SELECT pg_sleep(2)", "SELECT 1"],
                user: third
            )
            overheard.withLock { $0 = output ?? "" }
        }
        eavesdropper.start()
        Thread.sleep(forTimeInterval: 0.5)

        // The group's processes moved by themselves: every job, the mailbox, live messages on the new channel.
        #expect(eventually(timeout: 20) { handled.values.count >= 60 }, "\(handled.values.count) jobs of 60")
        #expect(handled.values == Array(0..<60), "every job once, in order")
        try writerWormhole.passMessageObject("after", identifier: "box")
        #expect(eventually { boxes.values.last == "after" })
        #expect(eventually { (try? writerWormhole.sendMessage("after", identifier: "ticks")) == 1 })
        #expect(eventually { ticks.values.contains("after") })
        #expect(revokedTicks.values == ["before"])

        // The revoked role: no row of the group, no endpoint left, nothing heard on the old channel, no write.
        #expect(
            try server.psql("SELECT count(*) FROM wormhole.groups WHERE grp = '\(roles.groupA)'", user: third) == "0"
        )
        let endpoints = try server.psql(
            """
            SELECT count(*) FROM wormhole.live_endpoints e JOIN pg_stat_activity a ON a.pid = e.backend_pid
            WHERE e.grp = '\(roles.groupA)' AND a.usename = '\(third)'
            """
        )
        #expect(endpoints == "0")
        #expect(eventually { overheard.withLock { $0 } != nil })
        #expect(Self.heard(overheard.withLock { $0 } ?? "").isEmpty, "\(overheard.withLock { $0 } ?? "")")
        let refused = wormholeError { try revokedWormhole.passMessageObject("revoked", identifier: "box") }
        #expect(refused?.code == .serverRejected, "\(String(describing: refused))")
        #expect(boxes.values.last == "after")
        #expect(try roles.administration.status(group: roles.groupA).groups.first?.grantsOfDroppedRoles == [])
    }

    // MARK: Time limits on the server

    @Test("The server ends a statement, and a wait for a lock, at the engine's time-out; the connection goes on")
    func serverTimeLimits() async throws { try await offThePool { try serverTimeLimitsBody() } }

    func serverTimeLimitsBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("limits")
        let engine = try PostgresEngine(url: server.url, group: group, timeout: .seconds(1))
        defer { engine.close() }
        let connections = engine.core.connections
        let settings = try connections.query(
            """
            SELECT current_setting('statement_timeout') || ' ' || current_setting('lock_timeout') || ' '
                || current_setting('idle_in_transaction_session_timeout')
            """,
            doing: "reading the session's limits"
        )
        #expect(try decode(String.self, settings.first, doing: "reading") == "900ms 800ms 1min")

        // A statement past the limit is ended by the server itself: its error, and no backend still at it.
        let started = ContinuousClock.now
        let sleeping = wormholeError { _ = try connections.query("SELECT pg_sleep(10)", doing: "sleeping") }
        #expect(sleeping?.message.contains("57014") == true, "\(String(describing: sleeping))")
        #expect(ContinuousClock.now - started < .seconds(5))
        let active = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(10)' AND state = 'active'"
        #expect(try server.psql(active) == "0")

        // A statement the server's limits would let run (as on a connection whose settings were changed), which
        // the engine gives up on at its time-out: closing the connection stops the backend's statement too
        // (`client_connection_check_interval`), where it ran on for its 30 s before.
        let unlimited = "SELECT pg_sleep(30) /* unlimited */"
        let given = wormholeError {
            try connections.withConnection { (connection) throws(WormholeError) in
                try connections.run("SET statement_timeout = 0", on: connection, doing: "lifting the limit")
                try connections.run(PostgresQuery(unsafeSQL: unlimited), on: connection, doing: "sleeping long")
            }
        }
        #expect(given?.code == .serverUnavailable, "\(String(describing: given))")
        let stillAt = "SELECT count(*) FROM pg_stat_activity WHERE query = '\(unlimited)'"
        #expect(eventually(timeout: 5) { (try? server.psql(stillAt)) == "0" }, "the backend went on sleeping")

        // A suite's row locked by another session (psql, in a transaction it keeps open for 3 s): the update waits
        // no longer than the limit, and fails with the server's lock time-out.
        let wormhole = Wormhole(engine: engine, sender: "limits")
        let suite = try wormhole.suite("settings")
        try suite.set("before", forKey: "key")
        let holder = Thread {
            _ = try? server.psql(commands: [
                "BEGIN", "SELECT 1 FROM wormhole.suites WHERE grp = '\(group)' FOR UPDATE", "SELECT pg_sleep(3)",
                "COMMIT",
            ])
        }
        holder.start()
        #expect(
            eventually {
                (try? server.psql("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(3)'")) == "1"
            }
        )
        let locked = wormholeError { try suite.set("while locked", forKey: "key") }
        #expect(locked?.message.contains("55P03") == true, "\(String(describing: locked))")
        #expect(
            eventually(timeout: 10) {
                (try? server.psql("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(3)'")) == "0"
            }
        )
        // The engine's connections work on.
        try suite.set("after", forKey: "key")
        #expect(try suite.value(forKey: "key", as: String.self) == "after")
    }

    @Test("A suite update whose closure is held up holds up no other update; it runs again, over the other's change")
    func suiteUpdateHoldsNoLock() async throws { try await offThePool { try suiteUpdateHoldsNoLockBody() } }

    func suiteUpdateHoldsNoLockBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("optimistic")
        let slowEngine = try PostgresEngine(url: server.url, group: group)
        defer { slowEngine.close() }
        let quickEngine = try PostgresEngine(url: server.url, group: group)
        defer { quickEngine.close() }
        let slow = try Wormhole(engine: slowEngine, sender: "slow").suite("counters")
        let quick = try Wormhole(engine: quickEngine, sender: "quick").suite("counters")
        try quick.set(0, forKey: "count")

        let runs = Locked(0)
        let inside = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let updated = DispatchSemaphore(value: 0)
        let slowThread = Thread {
            try? slow.update { values in
                let run = runs.withLock { (count: inout Int) -> Int in
                    count += 1
                    return count
                }
                if run == 1 {
                    inside.signal()
                    _ = release.wait(timeout: .now() + 20)  // held in its closure, as a stopped process would be
                }
                try values.set((values["count", as: Int.self] ?? 0) + 10, forKey: "count")
            }
            updated.signal()
        }
        slowThread.start()
        #expect(inside.wait(timeout: .now() + 10) == .success)
        // While the slow closure is held, another process's update goes through at once.
        let started = ContinuousClock.now
        try quick.update { values in try values.set((values["count", as: Int.self] ?? 0) + 1, forKey: "count") }
        #expect(ContinuousClock.now - started < .seconds(2), "the update waited for the held closure")
        #expect(try quick.value(forKey: "count", as: Int.self) == 1)
        release.signal()
        #expect(updated.wait(timeout: .now() + 20) == .success)
        // The slow update saw it had been overtaken, ran again over the new value, and both changes are there.
        #expect(runs.withLock { $0 } == 2)
        #expect(try quick.value(forKey: "count", as: Int.self) == 11)
        let changes = try #require(try quick.store.changes(after: 0).changes)
        #expect(changes.map(\.sender) == ["quick", "quick", "slow"])
    }

    // MARK: A stopped listener

    /// A job the stopped listener's test enqueues: its number, and padding that makes each notification large.
    struct PaddedJob: Codable {
        var index: Int
        var pad: String
    }

    /// Figures of the server while a listener is stopped: the notification queue's usage (0 to 1), and how many of
    /// the stopped process's connections the server still has.
    static func serverSide(_ server: LocalPostgresServer, application: String) throws -> (usage: Double, count: Int) {
        let text = try server.psql(
            """
            SELECT pg_notification_queue_usage() || ' ' || (SELECT count(*) FROM pg_stat_activity
                WHERE application_name = '\(application)')
            """
        )
        let fields = text.split(separator: " ")
        return (Double(fields.first ?? "") ?? -1, Int(fields.last ?? "") ?? -1)
    }

    @Test("A listening process stopped for 30 s while writers go on: no write fails; after SIGCONT, every job in order")
    func stoppedListener() async throws {
        // On a thread of its own, outside the gate of blocking bodies: it mostly waits on a stopped process, and
        // holding one of the gate's two places for half a minute made other suites pass their time limits.
        try await withTaskExecutorPreference(DedicatedThreadExecutor()) { try stoppedListenerBody() }
    }

    func stoppedListenerBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("stopped")
        let application = "stopped-\(getpid())"
        let jobs = 300
        let child = try RunningTool([
            "consume", "jobs", "--postgres", server.url + "&application_name=\(application)", "--group", group,
            // One more than it gets: it is still there to be measured once it has every job.
            "--consumer", "worker", "--count", String(jobs + 1), "--timeout", "300",
        ])
        // Whatever fails from here on, the child is not left stopped, and the records go.
        defer {
            child.kill(signal: SIGCONT)
            child.kill()
            _ = child.finish(timeout: 30)
            _ = try? server.psql("DELETE FROM wormhole.queue_records WHERE grp = '\(group)'")
        }
        #expect(child.waitForError(containing: "consuming jobs", timeout: 30), "\(child.errorSoFar)")
        let engine = try PostgresEngine(url: server.url, group: group)
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "writer")
        let queue = try wormhole.queue("jobs")
        // Nobody consumes "noise": its appends only make large notifications on the group's channel, which the
        // stopped process's connection stops taking once its socket buffers are full.
        let noise = try wormhole.queue("noise")
        let padding = String(repeating: "x", count: 4_000)
        try queue.enqueue(PaddedJob(index: 0, pad: ""))
        #expect(eventually(timeout: 30) { consumedIndexes(child.outputLines) == [0] })
        let residentBefore = Self.residentKiB(of: child.processIdentifier)
        let connectionsBefore = try Self.serverSide(server, application: application).count

        child.kill(signal: SIGSTOP)
        let start = ContinuousClock.now
        var next = 1
        var noiseSent = 0
        var peakUsage = 0.0
        var lastCheck = start
        var serverLetGo: Duration?
        // 30 s of writes, each of which must succeed: a job every 100 ms, and noise between them.
        while ContinuousClock.now - start < .seconds(30) {
            if next < jobs, ContinuousClock.now - start >= .milliseconds(100 * next) {
                try queue.enqueue(PaddedJob(index: next, pad: ""))
                next += 1
            }
            try noise.enqueue(PaddedJob(index: noiseSent, pad: padding))
            noiseSent += 1
            if ContinuousClock.now - lastCheck >= .seconds(1) {
                lastCheck = .now
                let (usage, connections) = try Self.serverSide(server, application: application)
                peakUsage = max(peakUsage, usage)
                if connections < connectionsBefore, serverLetGo == nil { serverLetGo = ContinuousClock.now - start }
            }
            Thread.sleep(forTimeInterval: 0.002)
        }
        let (usageAtEnd, _) = try Self.serverSide(server, application: application)
        print(
            "stoppedListener: \(noiseSent) noise appends of 4 KB and \(next) jobs in 30 s; the server let go of the "
                + "stopped listening connection after \(serverLetGo.map { "\($0)" } ?? "never"); notification queue usage "
                + "peak \(peakUsage), at the end \(usageAtEnd)"
        )
        child.kill(signal: SIGCONT)
        while next < jobs {
            try queue.enqueue(PaddedJob(index: next, pad: ""))
            next += 1
        }
        #expect(eventually(timeout: 120) { consumedIndexes(child.outputLines).count >= jobs })
        let peakResident = Self.residentKiB(of: child.processIdentifier, "VmHWM")
        #expect(consumedIndexes(child.outputLines) == Array(0..<jobs), "a job lost, repeated or out of order")
        print(
            "stoppedListener: the listener's resident memory \(residentBefore) KiB before the stop, peak "
                + "\(peakResident) KiB once it caught up"
        )
        // Linux's `tcp_user_timeout` (15 s on the listening connection) also bounds a zero window: the server drops
        // the connection of a process that stopped reading, and so releases the notification queue it held.
        #expect(serverLetGo != nil, "the server kept the stopped process's listening connection for 30 s")
        // Memory stays bounded: what the server sent while the process was stopped is what its socket held, and
        // the rest it reads from the table in batches.
        #expect(peakResident < residentBefore + 64 * 1024, "\(residentBefore) KiB before, \(peakResident) KiB peak")
    }

    /// A process's resident memory in KiB (`VmRSS` of `/proc/PID/status`, or another of its fields in KiB), 0 when
    /// it cannot be read.
    static func residentKiB(of pid: Int32, _ field: String = "VmRSS") -> Int {
        #if os(Linux) || os(Android)
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") })
        else { return 0 }
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
        #else
        return 0  // no /proc: the test that reads it runs on Linux only
        #endif
    }

    // MARK: Transfers

    @Test("A transfer's row naming a file outside the destination hands nothing over; a claimed one is delivered again")
    func transferPathsAreChecked() async throws { try await offThePool { try transferPathsAreCheckedBody() } }

    func transferPathsAreCheckedBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("transfer-paths")
        let scratch = TemporaryDirectory()
        let secret = scratch("id_ed25519")
        try Data("private key".utf8).write(to: URL(fileURLWithPath: secret))
        let source = scratch("report.txt")
        try Data("report text".utf8).write(to: URL(fileURLWithPath: source))  // as long as the secret
        let inbox = scratch("inbox")

        let senderEngine = try PostgresEngine(url: server.url, group: group)
        defer { senderEngine.close() }
        let exports = try Wormhole(engine: senderEngine, sender: "app").transfers("exports")
        let delivered = try exports.send(file: source)
        let claimed = try exports.send(file: source)
        // As a member could: one row says it was delivered to the secret, another that its delivery is under way
        // there (the file is there, of the right size, as a receiver killed after naming it would find).
        _ = try server.psql(
            """
            UPDATE wormhole.transfers SET state = CASE id WHEN '\(delivered.id)' THEN 'delivered' ELSE 'delivering' END,
                path = '\(secret)'
            WHERE grp = '\(group)'
            """
        )
        #expect(try server.psql("SELECT count(*) FROM wormhole.transfers WHERE grp = '\(group)'") == "2")

        let receiverEngine = try PostgresEngine(url: server.url, group: group)
        defer { receiverEngine.close() }
        let received = Collector<ReceivedFile>()
        let errors = Collector<WormholeError>()
        let receiver = try Wormhole(engine: receiverEngine, sender: "viewer").transfers("exports").receive(
            consumer: "viewer",
            into: inbox,
            errorHandler: { errors.append($0) }
        ) { received.append($0) }
        defer { receiver.cancel() }
        #expect(eventually { received.count >= 1 })
        #expect(errors.values.map(\.code) == [.untrustedFile], "\(errors.values)")
        #expect(errors.values.first?.message.contains(delivered.id) == true)
        // The claimed one came from its chunks, into the destination; the secret was never handed over.
        #expect(received.values.map(\.transfer.id) == [claimed.id])
        #expect(received.values.map(\.path) == [inbox + "/report.txt"])
        #expect(try String(contentsOfFile: inbox + "/report.txt", encoding: .utf8) == "report text")
        #expect(try String(contentsOfFile: secret, encoding: .utf8) == "private key")
    }

    @Test("Chunks no sender writes (one past the transfer's size, one over 1 MiB) are refused before they are written")
    func craftedChunks() async throws { try await offThePool { try craftedChunksBody() } }

    func craftedChunksBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("transfer-chunks")
        let scratch = TemporaryDirectory()
        let source = scratch("report.txt")
        try Data("report text".utf8).write(to: URL(fileURLWithPath: source))
        let inbox = scratch("inbox")
        let senderEngine = try PostgresEngine(url: server.url, group: group)
        defer { senderEngine.close() }
        let exports = try Wormhole(engine: senderEngine, sender: "app").transfers("exports")
        let extra = try exports.send(file: source)
        let oversized = try exports.send(file: source)
        // As a member could: a chunk after the last one of an 11-byte file, and a first chunk of 2 MiB.
        _ = try server.psql(
            """
            INSERT INTO wormhole.transfer_chunks (grp, channel, id, index, bytes)
            VALUES ('\(group)', 'exports', '\(extra.id)', 1, convert_to(repeat('x', 100), 'UTF8'));
            UPDATE wormhole.transfer_chunks SET bytes = convert_to(repeat('y', 2097152), 'UTF8')
            WHERE grp = '\(group)' AND id = '\(oversized.id)'
            """
        )
        let receiverEngine = try PostgresEngine(url: server.url, group: group)
        defer { receiverEngine.close() }
        let received = Collector<ReceivedFile>()
        let errors = Collector<WormholeError>()
        let receiver = try Wormhole(engine: receiverEngine, sender: "viewer").transfers("exports").receive(
            consumer: "viewer",
            into: inbox,
            errorHandler: { errors.append($0) }
        ) { received.append($0) }
        defer { receiver.cancel() }
        #expect(
            eventually {
                let messages = errors.values.map(\.message)
                return messages.contains { $0.contains(extra.id) } && messages.contains { $0.contains(oversized.id) }
            },
            "\(errors.values)"
        )
        #expect(errors.values.allSatisfy { $0.code == .corruptMessage }, "\(errors.values)")
        #expect(errors.values.allSatisfy { $0.message.contains("transfer_chunks") }, "\(errors.values)")
        #expect(errors.values.allSatisfy { $0.message.contains("passed over") }, "\(errors.values)")
        #expect(received.values.isEmpty, "a crafted transfer was handed over")
        // Nothing in the destination grew past the 11 bytes a transfer announced.
        let names = (try? FileManager.default.contentsOfDirectory(atPath: inbox)) ?? []
        for name in names {
            let size = (try? FileManager.default.attributesOfItem(atPath: inbox + "/" + name)[.size] as? Int) ?? 0
            #expect(size <= 11, "\(name) holds \(size) bytes")
        }
    }

    @Test("A receiver killed between naming the file and removing its hidden name: the file is handed over as it is")
    func killedBetweenLinkAndUnlink() async throws { try await offThePool { try killedBetweenLinkAndUnlinkBody() } }

    func killedBetweenLinkAndUnlinkBody() throws {
        let server = try requireTestServer()
        let group = uniqueGroup("transfer-link")
        let scratch = TemporaryDirectory()
        let source = scratch("report.txt")
        try Data("report text".utf8).write(to: URL(fileURLWithPath: source))
        let inbox = scratch("inbox")
        try FileManager.default.createDirectory(atPath: inbox, withIntermediateDirectories: true)
        let engine = try PostgresEngine(url: server.url, group: group)
        defer { engine.close() }
        let transfer = try Wormhole(engine: engine, sender: "app").transfers("exports").send(file: source)
        // What the receiver leaves when killed there: the copy whole under both names, the row `delivering` it.
        let named = inbox + "/report.txt"
        let hidden = inbox + "/." + transfer.id + ".part"
        try Data("report text".utf8).write(to: URL(fileURLWithPath: hidden))
        #expect(link(hidden, named) == 0)
        _ = try server.psql(
            "UPDATE wormhole.transfers SET state = 'delivering', path = '\(named)' WHERE grp = '\(group)'"
        )
        let received = Collector<ReceivedFile>()
        let errors = Collector<WormholeError>()
        let receiver = try Wormhole(engine: engine, sender: "viewer").transfers("exports").receive(
            consumer: "viewer",
            into: inbox + "/",  // another spelling of the same destination
            errorHandler: { errors.append($0) }
        ) { received.append($0) }
        defer { receiver.cancel() }
        #expect(eventually { received.count >= 1 })
        #expect(errors.values.isEmpty, "\(errors.values)")
        #expect(received.values.map(\.path) == [named])
        #expect(TransferContract.contents(of: inbox) == ["report.txt"], "the hidden name went, no second copy")
        #expect(try String(contentsOfFile: named, encoding: .utf8) == "report text")
    }

    // MARK: Roles

    @Test("A dropped role breaks none of its groups, and a new role of its name inherits no grant")
    func droppedRole() async throws { try await offThePool { try droppedRoleBody() } }

    func droppedRoleBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "dropped")
        defer { roles.close() }
        let third = PostgresSecurityTests.uniqueRole()
        defer { PostgresSecurityTests.dropRoles([third], on: server) }
        try server.psql("CREATE ROLE \(third) LOGIN", database: "postgres")
        try roles.administration.grant(group: roles.groupA, to: third)
        let url = PostgresSecurityTests.url(server, user: roles.one)
        let engine = try PostgresEngine(url: url, group: roles.groupA, setsUpSchema: false)
        try Wormhole(engine: engine, sender: "one").passMessageObject("before", identifier: "box")
        engine.close()

        // Dropped, as an administrator does: its privileges first, then the role. Its grant's row stays.
        PostgresSecurityTests.dropRoles([third], on: server)
        let again = try PostgresEngine(url: url, group: roles.groupA, setsUpSchema: false)
        defer { again.close() }
        let wormhole = Wormhole(engine: again, sender: "one")
        #expect(try wormhole.message(withIdentifier: "box", as: String.self) == "before")
        try wormhole.passMessageObject("after", identifier: "box")
        #expect(try roles.administration.status(group: roles.groupA).groups.first?.grantsOfDroppedRoles == [third])

        // A new role of that name is another role: the old grant is not its.
        try server.psql("CREATE ROLE \(third) LOGIN", database: "postgres")
        let refused = wormholeError {
            _ = try PostgresEngine(
                url: PostgresSecurityTests.url(server, user: third),
                group: roles.groupA,
                setsUpSchema: false
            )
        }
        #expect(refused?.code == .serverRejected, "\(String(describing: refused))")
        // Granted anew, it is.
        try roles.administration.grant(group: roles.groupA, to: third)
        let granted = try PostgresEngine(
            url: PostgresSecurityTests.url(server, user: third),
            group: roles.groupA,
            setsUpSchema: false
        )
        #expect(try Wormhole(engine: granted).message(withIdentifier: "box", as: String.self) == "after")
        granted.close()
        #expect(try roles.administration.status(group: roles.groupA).groups.first?.grantsOfDroppedRoles == [])
    }

    // MARK: URLs

    @Test("A password holding % @ : / # ? and a space, percent-encoded as RFC 3986 says, connects")
    func passwordDecodedOnce() async throws { try await offThePool { try passwordDecodedOnceBody() } }

    func passwordDecodedOnceBody() throws {
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel(Comment(rawValue: reason)) }
        let password = "p%41 @:/#?%"
        let server = try LocalPostgresServer(password: password)
        defer { server.close() }
        let encoded = "p%2541%20%40%3A%2F%23%3F%25"
        let url = "postgres://wormhole:\(encoded)@\(server.host):\(server.port)/wormhole?sslmode=disable"
        let location = try PostgresLocation(url: url)
        #expect(location.configuration.password == password)
        #expect(!location.description.contains(encoded))
        let engine = try PostgresEngine(url: url, group: uniqueGroup("password"))
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine)
        try wormhole.passMessageObject("in", identifier: "box")
        #expect(try wormhole.message(withIdentifier: "box", as: String.self) == "in")
        // A % that starts no escape: Foundation on Linux reads it as itself (Apple's may refuse the URL, with an
        // error that does not echo it); decoded twice, it would have been no password at all.
        do {
            let bare = try PostgresLocation(url: "postgres://wormhole:p%zz%@localhost/wormhole")
            #expect(bare.configuration.password == "p%zz%")
        } catch {
            #expect(error.code == .serverUnavailable && !error.message.contains("p%zz"), "\(error)")
        }
    }

    @Test("URL parameters: libpq's names are read, any other is refused, sslrootcert=system insists on verify-full")
    func urlParameters() throws {
        let base = "postgres://app@db.example.com:6432/app"
        let location = try PostgresLocation(
            url: base + "?host=other.example.com&port=7000&user=worker&dbname=jobs&connect_timeout=3"
                + "&application_name=reports&sslmode=disable"
        )
        #expect(location.configuration.host == "other.example.com")
        #expect(location.configuration.port == 7000)
        #expect(location.configuration.username == "worker")
        #expect(location.configuration.database == "jobs")
        #expect(location.configuration.options.connectTimeout == .seconds(3))
        #expect(location.configuration.options.additionalStartupParameters.map(\.1) == ["reports"])
        let socket = try PostgresLocation(url: base + "?host=/run/postgresql")
        #expect(socket.configuration.unixSocketPath == "/run/postgresql/.s.PGSQL.6432")

        for (query, expected) in [
            ("sslmod=require", "sslmod"),
            ("target_session_attrs=read-write", "target_session_attrs"),
            ("sslmode=verify-fulll", "verify-fulll"),
            ("sslrootcert=system&sslmode=require", "verify-full"),
            ("sslcert=/tmp/client.crt", "sslkey"),
            ("sslcert=/nonexistent.crt&sslkey=/nonexistent.key", "/nonexistent.crt"),
            ("port=99999", "99999"),
            ("connect_timeout=soon", "soon"),
        ] {
            let error = wormholeError { _ = try PostgresLocation(url: base + "?" + query) }
            #expect(error?.code == .serverUnavailable, "\(query): \(String(describing: error))")
            #expect(error?.message.contains(expected) == true, "\(query): \(String(describing: error))")
        }
        // sslrootcert=system alone means verify-full, and is accepted.
        _ = try PostgresLocation(url: base + "?sslrootcert=system")
    }
}
