import Foundation
import NIOCore
import NIOFoundationCompat
import PostgresNIO
import WormholeKit

/// A durable queue in `wormhole.queue_records`, with each consumer's position in `wormhole.queue_consumers`.
///
/// An append takes its offsets from the queue's head row (`wormhole.queues.next_offset`) in the statement that
/// inserts the records and notifies. The head row stays locked until the append commits, so appends commit in
/// offset order: a reader never sees offset 8 before 7 is visible, the gap a `bigserial` would leave when an earlier
/// transaction commits later.
final class PostgresQueueLog: QueueLog {
    let engine: PostgresCore
    let identifier: String
    let sender: String
    let retention: Duration
    /// The largest record, as the directory engine's.
    static let recordLimit = 64 << 20
    /// A read returns records up to about this many bytes (at least one record).
    static let readLimit = 8 << 20

    init(engine: PostgresCore, identifier: String, sender: String, retention: Duration) {
        self.engine = engine
        self.identifier = identifier
        self.sender = sender
        self.retention = retention
    }

    var notificationName: String { "queue." + identifier }

    func append(contentsOf payloads: some Sequence<Data>) throws(WormholeError) {
        var buffers: [ByteBuffer] = []
        for payload in payloads {
            guard payload.count <= Self.recordLimit else {
                throw WormholeError(
                    .messageTooLarge,
                    "The message is \(payload.count) bytes; a queue accepts up to 64 MiB.",
                    identifier: identifier
                )
            }
            buffers.append(ByteBuffer(data: payload))
        }
        guard !buffers.isEmpty else { return }
        let now = Int64(Date().timeIntervalSince1970 * 1e9)
        let carried = CarriedAppend.carried(identifier: identifier, sender: sender, time: now, payloads: buffers)
        let binds = [
            PostgresData(string: engine.group), PostgresData(string: identifier), PostgresData(string: sender),
            PostgresData(int64: now),
            PostgresData(array: buffers.map { PostgresData(type: .bytea, value: $0) }, elementType: .bytea),
            PostgresData(string: ""), PostgresData(string: "n" + notificationName),
            carried.map(PostgresData.init(string:)) ?? .null,
        ]
        let what = "appending to the queue \(identifier)"
        // No row: the queue has no head row yet (its first append), and nothing was written. The function makes it.
        if try engine.connections.execute(.queueAppendToHead, binds, doing: what).isEmpty {
            try engine.connections.execute(.queueAppend, binds, doing: what)
        }
    }

    func openCursor(consumer: String) throws(WormholeError) -> any QueueCursor {
        try MessageIdentifier.validate(consumer)
        let rows = try engine.connections.query(
            """
            INSERT INTO wormhole.queue_consumers AS c (grp, queue, consumer, position)
            VALUES (\(engine.group), \(identifier), \(consumer), coalesce((SELECT first_kept FROM wormhole.queues
                WHERE grp = \(engine.group) AND queue = \(identifier)), 0))
            ON CONFLICT (grp, queue, consumer) DO UPDATE SET seen = now()
            RETURNING c.position
            """,
            doing: "opening the consumer \(consumer) of \(identifier)"
        )
        let position = try decode(Int64.self, rows.first, doing: "opening the consumer \(consumer)")
        return PostgresQueueCursor(
            log: self,
            consumer: consumer,
            position: try RowValues.count(
                position,
                "position",
                of: "queue_consumers",
                row: consumerRow(consumer),
                identifier: identifier
            )
        )
    }

    func status() throws(WormholeError) -> QueueStatus {
        let what = "reading the status of \(identifier)"
        let end = try engine.connections.query(
            """
            SELECT coalesce((SELECT next_offset FROM wormhole.queues
                WHERE grp = \(engine.group) AND queue = \(identifier)), 0)
            """,
            doing: what
        )
        let rows = try engine.connections.query(
            """
            SELECT c.consumer, c.position, coalesce(sum(octet_length(r.payload)), 0)::bigint, count(r."offset")
            FROM wormhole.queue_consumers c
            LEFT JOIN wormhole.queue_records r
                ON r.grp = c.grp AND r.queue = c.queue AND r."offset" >= c.position
            WHERE c.grp = \(engine.group) AND c.queue = \(identifier)
            GROUP BY c.consumer, c.position ORDER BY c.consumer COLLATE "C"
            """,
            doing: what
        )
        var consumers: [QueueStatus.Consumer] = []
        for row in rows {
            let (name, position, bytes, count): (String, Int64, Int64, Int64)
            do { (name, position, bytes, count) = try row.decode((String, Int64, Int64, Int64).self) } catch {
                throw WormholeError(.serverRejected, "Unexpected columns while \(what): \(error).")
            }
            let table = "queue_consumers"
            consumers.append(
                QueueStatus.Consumer(
                    name: name,
                    offset: try RowValues.count(position, "position", of: table, row: consumerRow(name)),
                    // Sums and counts the server made: never negative, but checked as every number read.
                    lagBytes: try RowValues.count(bytes, "a lag in bytes", of: table, row: consumerRow(name)),
                    lagMessages: Int(clamping: try RowValues.count(count, "a lag", of: table, row: consumerRow(name)))
                )
            )
        }
        let endOffset = try decode(Int64.self, end.first, doing: what)
        return QueueStatus(
            identifier: identifier,
            endOffset: try RowValues.count(endOffset, "next_offset", of: "queues", row: "the queue \(identifier)"),
            consumers: consumers
        )
    }

    /// What names a consumer's row in an error.
    func consumerRow(_ consumer: String) -> String {
        "the consumer \(consumer) of the queue \(identifier) of group \(engine.group)"
    }

    func reclaimSpace() throws(WormholeError) {
        let seconds = retention.secondsValue
        try engine.connections.transaction(doing: "reclaiming space in \(identifier)") {
            (connection) throws(WormholeError) in
            let what = "reclaiming space in \(identifier)"
            try engine.connections.run(
                """
                DELETE FROM wormhole.queue_consumers WHERE grp = \(engine.group) AND queue = \(identifier)
                    AND seen < now() - make_interval(secs => \(seconds))
                """,
                on: connection,
                doing: what
            )
            // Under the head row's lock, so that no append and no new consumer comes in between.
            try engine.connections.run(
                """
                WITH head AS (SELECT next_offset FROM wormhole.queues
                    WHERE grp = \(engine.group) AND queue = \(identifier) FOR UPDATE),
                lowest AS (SELECT coalesce((SELECT min(position) FROM wormhole.queue_consumers
                    WHERE grp = \(engine.group) AND queue = \(identifier)), (SELECT next_offset FROM head)) AS position),
                dropped AS (DELETE FROM wormhole.queue_records WHERE grp = \(engine.group) AND queue = \(identifier)
                    AND "offset" < (SELECT position FROM lowest) RETURNING 1)
                UPDATE wormhole.queues SET first_kept = greatest(first_kept, (SELECT position FROM lowest))
                WHERE grp = \(engine.group) AND queue = \(identifier) AND EXISTS (SELECT 1 FROM head)
                    AND (SELECT count(*) FROM dropped) >= 0
                """,
                on: connection,
                doing: what
            )
        }
    }
}

/// A consumer's position in a PostgreSQL queue.
final class PostgresQueueCursor: QueueCursor {
    let log: PostgresQueueLog
    let consumer: String
    private let stored: Locked<UInt64>
    /// When this cursor last reclaimed space: it does every ``reclaimInterval`` as it acknowledges.
    private let lastReclaim = Locked(ContinuousClock.now)
    static let reclaimInterval = Duration.seconds(10)

    init(log: PostgresQueueLog, consumer: String, position: UInt64) {
        self.log = log
        self.consumer = consumer
        stored = Locked(position)
    }

    var position: UInt64 { stored.withLock { $0 } }

    /// Records that append notifications carried, by offset: the next ones are read from here, not from the table.
    private let carried = Locked<[UInt64: QueueRecord]>([:])
    /// Beyond this many carried records the consumer is behind: they are dropped, and it reads the table.
    static let carriedLimit = 4_096

    func read(maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        touchIfDue()
        let fromNotifications = takeCarried(maximumCount: maximumCount)
        if !fromNotifications.isEmpty { return fromNotifications }
        return try read(acknowledgingThrough: nil, maximumCount: max(1, maximumCount))
    }

    /// Records handed over from notifications and not acknowledged yet, by offset: the acknowledgement that covers
    /// them checks them against the table, byte for byte (they are small: a notification carried them).
    private let handed = Locked<[UInt64: QueueRecord]>([:])

    /// The records from the position on that append notifications carried, up to `maximumCount` (at least one);
    /// none when the next one was not carried.
    private func takeCarried(maximumCount: Int) -> [QueueRecord] {
        let position = self.position
        let records = carried.withLock { carried -> [QueueRecord] in
            if let lowest = carried.keys.min(), lowest < position {
                carried = carried.filter { $0.key >= position }
            }
            var records: [QueueRecord] = []
            var next = position
            while records.count < max(1, maximumCount), let record = carried[next] {
                records.append(record)
                next += 1
            }
            return records
        }
        guard !records.isEmpty else { return records }
        // A member of the group can seal a notification of its own (it holds the key, and may call the functions
        // that seal): so what a notification carried is handled, then confirmed by the acknowledgement, which
        // moves the position only when each record is the table's.
        handed.withLock { handed in
            if let lowest = handed.keys.min(), lowest < position { handed = handed.filter { $0.key >= position } }
            for record in records { handed[record.offset] = record }
        }
        return records
    }

    /// The handed records an acknowledgement through `end` covers, in offset order.
    private func handedBefore(_ end: UInt64) -> [QueueRecord] {
        handed.withLock { handed in
            guard !handed.isEmpty else { return [] }
            return handed.values.filter { $0.offset < end }.sorted { $0.offset < $1.offset }
        }
    }

    /// Keeps records an append notification carried, for the reads to come.
    private func take(_ records: [QueueRecord]) {
        let position = self.position
        carried.withLock { carried in
            for record in records where record.offset >= position { carried[record.offset] = record }
            if carried.count > Self.carriedLimit { carried.removeAll() }
        }
    }

    func acknowledge(through end: UInt64) throws(WormholeError) {
        _ = try read(acknowledgingThrough: end, maximumCount: 0)
    }

    func acknowledge(through end: UInt64, thenRead maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        // When a notification carried the next record, the round trip only acknowledges: reading the table again
        // for what is already here would cost the server a scan of the records per message.
        guard carried.withLock({ $0[end] != nil }) else {
            return try read(acknowledgingThrough: end, maximumCount: max(1, maximumCount))
        }
        _ = try read(acknowledgingThrough: end, maximumCount: 0)
        return try read(maximumCount: maximumCount)
    }

    /// Acknowledges through `end` when it is given, then reads up to `maximumCount` records (none when 0) from the
    /// position stored on the server, which only this consumer's acknowledgements move: one round trip.
    private func read(acknowledgingThrough end: UInt64?, maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        let engine = log.engine
        let what =
            end == nil
            ? "reading the queue \(log.identifier) as \(consumer)"
            : "acknowledging \(log.identifier) as \(consumer)"
        var binds = [
            PostgresData(string: engine.group), PostgresData(string: log.identifier), PostgresData(string: consumer),
            try end.map { (end) throws(WormholeError) in
                PostgresData(int64: try RowValues.bigint(end, "The end acknowledged", identifier: log.identifier))
            } ?? .null,
        ]
        let checks = end.map(handedBefore) ?? []
        // Returns once the acknowledgement has committed: the server sends a statement's end at the Sync after
        // it, when it commits (FORMAT-POSTGRES.md, "Queues").
        let position: Int64?
        let records: [QueueRecord]
        do throws(WormholeError) {
            if end != nil && maximumCount == 0 {
                // Only an acknowledgement (the next record came with a notification, or a consumer acknowledges
                // apart): a plain UPDATE, where the function that reads too costs the server about a third more.
                let rows = try engine.connections.execute(
                    checks: checks,
                    plain: .queueAcknowledge,
                    one: .queueAcknowledgeCheckedOne,
                    several: .queueAcknowledgeChecked,
                    binds,
                    doing: what
                )
                // No row: the consumer is not registered (below).
                position = rows.isEmpty ? nil : try decode(Int64.self, rows.first, doing: what)
                records = []
            } else {
                binds += [
                    PostgresData(int32: Int32(clamping: maximumCount)),
                    PostgresData(int64: Int64(PostgresQueueLog.readLimit)),
                ]
                let rows = try engine.connections.execute(
                    checks: checks,
                    plain: .queueRead,
                    one: .queueReadCheckedOne,
                    several: .queueReadChecked,
                    binds,
                    doing: what
                )
                (position, records) = try decodeRecords(rows, doing: what)
            }
        } catch {
            // An acknowledgement that failed here may have committed there: the position kept here is no longer
            // sure, so the next read is the table's, never records carried from before.
            carried.withLock { $0.removeAll() }
            throw error
        }
        guard let position else {
            throw WormholeError(
                .serverRejected,
                "The consumer \(consumer) of \(log.identifier) is no longer registered: it stayed away longer than "
                    + "the queue's retention and was dropped. Open it again to start from the oldest record kept.",
                identifier: log.identifier
            )
        }
        let checked = try RowValues.count(
            position,
            "position",
            of: "queue_consumers",
            row: log.consumerRow(consumer),
            identifier: log.identifier
        )
        stored.withLock { $0 = checked }
        // What is behind the position, or was just read from the table, needs no check any more.
        handed.withLock { handed in
            guard !handed.isEmpty else { return }
            handed = handed.filter { $0.key >= checked }
            for record in records { handed[record.offset] = nil }
        }
        if let end, !checks.isEmpty, checked < end { refused(checks, end: end) }
        if end != nil { reclaimIfDue() }
        return records
    }

    /// An acknowledgement the server refused: some record handed from a notification is not the table's. The
    /// position stays where it was, so the consumer reads the real records from there next (nothing is skipped),
    /// and carried records are no longer believed until then.
    private func refused(_ checks: [QueueRecord], end: UInt64) {
        carried.withLock { $0.removeAll() }
        handed.withLock { $0.removeAll() }
        let offsets = checks.map { String($0.offset) }.joined(separator: ", ")
        log.engine.logger.error(
            """
            PostgreSQL engine: a notification carried records of the queue \(log.identifier) that are not the \
            table's (offsets \(offsets), acknowledged through \(end) as \(consumer)): a member of the group sealed \
            a notification of its own. They were handled; the position did not move, and the queue's own records at \
            those offsets are delivered next.
            """
        )
        log.engine.hub.refused.add(1, ordering: .relaxed)
    }

    /// The consumer's position (nil when no row came: the consumer is not registered) and the records.
    private func decodeRecords(
        _ rows: [PreparedRow],
        doing what: String
    ) throws(WormholeError) -> (Int64?, [QueueRecord]) {
        var records: [QueueRecord] = []
        records.reserveCapacity(rows.count)
        var position: Int64?
        for row in rows {
            let (offset, sender, time, payload): (Int64, String, Int64, ByteBuffer)
            do {
                var columns = row.columns()
                position = try columns.decode(Int64.self)
                offset = try columns.decode(Int64.self)
                // -1: the function's row that says there is no record, for the position alone.
                if offset == -1 { continue }
                sender = try columns.decode(String.self)
                time = try columns.decode(Int64.self)
                payload = try columns.decode(ByteBuffer.self)
            } catch {
                throw WormholeError(
                    .corruptMessage,
                    "Unexpected columns while \(what): \(error).",
                    identifier: log.identifier
                )
            }
            try checkRecord(offset: offset, bytes: payload.readableBytes, after: records.last, from: position)
            records.append(
                QueueRecord(
                    offset: UInt64(offset),
                    end: UInt64(offset) + 1,
                    sender: sender,
                    timestampNanoseconds: time,
                    payload: Data(buffer: payload)
                )
            )
        }
        return (position, records)
    }

    /// Checks a record a read returned before it is handed over: its offset in range, at or past the consumer's
    /// position and past the record before it (the function reads in offset order, so anything else is a row someone
    /// crafted), and its payload within what a writer of this package stores.
    private func checkRecord(
        offset: Int64,
        bytes: Int,
        after previous: QueueRecord?,
        from position: Int64?
    ) throws(WormholeError) {
        let row = "the record \(offset) of the queue \(log.identifier) of group \(log.engine.group)"
        let checked = try RowValues.count(offset, "offset", of: "queue_records", row: row, identifier: log.identifier)
        guard position.map({ offset >= $0 }) ?? false, previous.map({ checked >= $0.end }) ?? true else {
            throw RowValues.corrupt(
                "an offset before the consumer's position or the record read before it",
                of: "queue_records",
                row: row,
                identifier: log.identifier
            )
        }
        guard bytes <= PostgresQueueLog.recordLimit else {
            throw RowValues.corrupt(
                "a payload of \(bytes) bytes (past 64 MiB)",
                of: "queue_records",
                row: row,
                identifier: log.identifier
            )
        }
    }

    /// When this cursor last told the server that its consumer is at work.
    private let lastTouch = Locked(ContinuousClock.now)

    /// Moves the consumer's `seen` now and then while it reads (each wake-up reads, the safety poll's too): a consumer
    /// waiting on a quiet queue acknowledges nothing for days, and reclaiming must not take it for one gone and
    /// delete the records it has not handled. A failure is left for the next read: the consumer is not stopped.
    private func touchIfDue() {
        let interval = min(Duration.seconds(60), log.retention / 4)
        let due = lastTouch.withLock { last in
            guard ContinuousClock.now - last >= interval else { return false }
            last = .now
            return true
        }
        guard due else { return }
        do {
            try log.engine.connections.query(
                """
                UPDATE wormhole.queue_consumers SET seen = now()
                WHERE grp = \(log.engine.group) AND queue = \(log.identifier) AND consumer = \(consumer)
                """,
                doing: "telling the server that consumer \(consumer) of \(log.identifier) is at work"
            )
        } catch {
            log.engine.logger.debug("PostgreSQL engine: could not refresh a queue consumer's time: \(error)")
        }
    }

    /// Records every consumer has passed are deleted as consumers move on, not only when someone asks.
    private func reclaimIfDue() {
        let due = lastReclaim.withLock { last in
            guard ContinuousClock.now - last >= Self.reclaimInterval else { return false }
            last = .now
            return true
        }
        guard due else { return }
        do { try log.reclaimSpace() } catch {
            log.engine.logger.debug("PostgreSQL engine: reclaiming space in \(log.identifier) failed: \(error)")
        }
    }

    func observeAppends(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        let records = log.engine.hub.takeRecords(of: log.identifier) { [weak self] in self?.take($0) }
        let appends: NotifierObservation
        do throws(WormholeError) {
            appends = try log.engine.hub.observe(log.notificationName, handler: handler)
        } catch {
            records.cancel()
            throw error
        }
        return NotifierObservation {
            appends.cancel()
            records.cancel()
        }
    }
}

/// An append's records as its notification carries them, when they are small: `Q`, the first offset in decimal, `:`,
/// then netstrings of the queue's identifier, the sender, the time in nanoseconds in decimal, and each payload in
/// Base64 (FORMAT-POSTGRES.md, "Notifications on PostgreSQL"). A consumer whose next record is the first one carried takes
/// them without reading the table; any other reads it as ever.
struct CarriedAppend: Sendable, Equatable {
    var identifier: String
    var firstOffset: UInt64
    var sender: String
    var timestampNanoseconds: Int64
    var payloads: [Data]

    /// The most characters the carried part may have: the notification stays under PostgreSQL's 8,000 bytes.
    static let limit = 6_000

    /// The part after the first offset, which the server puts in front; nil when the records are too large.
    static func carried(identifier: String, sender: String, time: Int64, payloads: [ByteBuffer]) -> String? {
        var size = 0
        for payload in payloads {
            size += (payload.readableBytes + 2) / 3 * 4 + 8
            if size > limit { return nil }
        }
        var text = netstring(identifier) + netstring(sender) + netstring(String(time))
        for payload in payloads { text += netstring(Data(buffer: payload).base64EncodedString()) }
        return text.utf8.count <= limit ? text : nil
    }

    /// The queue an append notification names, read without its records; nil when it is not one.
    static func identifier(of notification: String) -> String? {
        var reader = NetstringReader(notification)
        guard reader.character() == "Q", reader.number(maximumDigits: 19) != nil else { return nil }
        return reader.field()
    }

    init(identifier: String, firstOffset: UInt64, sender: String, timestampNanoseconds: Int64, payloads: [Data]) {
        self.identifier = identifier
        self.firstOffset = firstOffset
        self.sender = sender
        self.timestampNanoseconds = timestampNanoseconds
        self.payloads = payloads
    }

    /// The append of a notification; nil when it is not one, or is damaged.
    init?(notification: String) {
        var reader = NetstringReader(notification)
        guard reader.character() == "Q", let first = reader.number(maximumDigits: 19), let identifier = reader.field(),
            let sender = reader.field(), let time = reader.field().flatMap({ Int64($0) })
        else { return nil }
        var payloads: [Data] = []
        while !reader.isAtEnd {
            guard let text = reader.field(), let payload = Data(base64Encoded: text) else { return nil }
            payloads.append(payload)
        }
        guard !payloads.isEmpty, first <= UInt64(Int64.max) - UInt64(payloads.count) else { return nil }
        self.init(
            identifier: identifier,
            firstOffset: first,
            sender: sender,
            timestampNanoseconds: time,
            payloads: payloads
        )
    }

    /// The notification, as the server makes it.
    var notification: String {
        "Q\(firstOffset):" + netstring(identifier) + netstring(sender) + netstring(String(timestampNanoseconds))
            + payloads.map { netstring($0.base64EncodedString()) }.joined()
    }

    /// The records, as a read of the table gives them.
    var records: [QueueRecord] {
        payloads.enumerated().map { index, payload in
            QueueRecord(
                offset: firstOffset + UInt64(index),
                end: firstOffset + UInt64(index) + 1,
                sender: sender,
                timestampNanoseconds: timestampNanoseconds,
                payload: payload
            )
        }
    }
}

extension Connections {
    /// Runs `plain` with `parameters` when no record handed from a notification is to be checked, or else its
    /// checked form for one record or for several, given the records after the parameters.
    fileprivate func execute(
        checks: [QueueRecord],
        plain: PreparedStatement,
        one: PreparedStatement,
        several: PreparedStatement,
        _ parameters: [PostgresData],
        doing what: String
    ) throws(WormholeError) -> [PreparedRow] {
        switch checks.count {
        case 0: try execute(plain, parameters, doing: what)
        case 1: try execute(one, parameters + PreparedStatement.checkBinds(checks[0]), doing: what)
        default: try execute(several, parameters + PreparedStatement.checkBinds(checks), doing: what)
        }
    }
}

extension PreparedStatement {
    /// An append (`wormhole.queue_append_sealed`): the group, the queue, the sender, the time, the payloads, the
    /// channel's suffix (empty), the notification and the records it carries (or null), which the server seals.
    static let queueAppend = PreparedStatement(
        sql: """
            SELECT wormhole.queue_append_sealed($1::text, $2::text, $3::text, $4::bigint, $5::bytea[], $6::text,
                $7::text, $8::text)
            """
    )

    /// An append to a queue whose head row exists, as `wormhole.queue_append` does it, in one statement: the same
    /// parameters; one row (the first offset) when it appended, none when the head row is missing. (The function costs
    /// the server about a sixth more: 71–74 against 58–64 µs a call, `pgbench` with `synchronous_commit` off.)
    static let queueAppendToHead = PreparedStatement(
        sql: """
            WITH head AS (
                UPDATE wormhole.queues q SET next_offset = q.next_offset + pg_catalog.cardinality($5::bytea[])
                WHERE q.grp = $1::text AND q.queue = $2::text
                RETURNING q.next_offset - pg_catalog.cardinality($5::bytea[]) AS first
            ), appended AS (
                INSERT INTO wormhole.queue_records (grp, queue, "offset", sender, time_ns, payload)
                SELECT $1::text, $2::text, head.first + p.ordinal - 1, $3::text, $4::bigint, p.payload
                FROM head, pg_catalog.unnest($5::bytea[]) WITH ORDINALITY AS p(payload, ordinal)
            )
            SELECT head.first, CASE WHEN $8::text IS NULL THEN wormhole.notify($1::text, $6::text, $7::text)
                ELSE wormhole.notify_sealed($1::text, $6::text, 'Q' || head.first || ':' || $8::text) END
            FROM head
            """
    )

    /// A consumer's acknowledgement, without a read: the group, the queue, the consumer and the end acknowledged.
    /// Returns the consumer's position, or no row when the consumer is not registered (as `wormhole.queue_read`).
    static let queueAcknowledge = PreparedStatement(
        sql: """
            UPDATE wormhole.queue_consumers c SET position = greatest(c.position, $4::bigint), seen = pg_catalog.now()
            WHERE c.grp = $1::text AND c.queue = $2::text AND c.consumer = $3::text
            RETURNING c.position
            """
    )

    /// A consumer's read (`wormhole.queue_read`): the group, the queue, the consumer, the end acknowledged (or
    /// null), the most records and about the most bytes.
    static let queueRead = PreparedStatement(
        sql: "SELECT * FROM wormhole.queue_read($1::text, $2::text, $3::text, $4::bigint, $5::integer, $6::bigint)"
    )

    /// What a checked statement is given of one handed record, after the statement's own parameters: its offset,
    /// time, sender and payload.
    fileprivate static func checkBinds(_ record: QueueRecord) -> [PostgresData] {
        [
            PostgresData(int64: Int64(clamping: record.offset)),
            PostgresData(int64: record.timestampNanoseconds),
            PostgresData(string: record.sender),
            PostgresData(type: .bytea, value: ByteBuffer(data: record.payload)),
        ]
    }

    /// What a checked statement is given of several handed records: arrays of their offsets, times, senders and
    /// payloads, in that order.
    fileprivate static func checkBinds(_ records: [QueueRecord]) -> [PostgresData] {
        [
            PostgresData(array: records.map { PostgresData(int64: Int64(clamping: $0.offset)) }, elementType: .int8),
            PostgresData(
                array: records.map { PostgresData(int64: $0.timestampNanoseconds) },
                elementType: .int8
            ),
            PostgresData(array: records.map { PostgresData(string: $0.sender) }, elementType: .text),
            PostgresData(
                array: records.map { PostgresData(type: .bytea, value: ByteBuffer(data: $0.payload)) },
                elementType: .bytea
            ),
        ]
    }

    /// Whether the record given by the statement's parameters `$o` (offset), `$t` (time), `$s` (sender) and `$p`
    /// (payload) is the table's record at its offset, byte for byte: one lookup on the primary key. (Compared
    /// whole, not by digest: `pgbench` timed an acknowledgement checked so at 51 µs, by SHA-256 at 68, a plain one
    /// at 43.)
    private static func isTheTables(offset o: String, time t: String, sender s: String, payload p: String) -> String {
        """
        EXISTS (SELECT 1 FROM wormhole.queue_records r WHERE r.grp = $1::text AND r.queue = $2::text \
        AND r."offset" = \(o) AND r.time_ns = \(t) AND r.sender = \(s) AND r.payload = \(p))
        """
    }

    /// ``queueAcknowledge`` of one record handed from a notification: the same parameters, then the record's
    /// offset, time, sender and payload (``checkBinds(_:)-(QueueRecord)``). The position moves only when the record
    /// is behind it already or is the table's record at its offset; otherwise it stays, and the row returned says
    /// where.
    static let queueAcknowledgeCheckedOne = PreparedStatement(
        sql: """
            UPDATE wormhole.queue_consumers c SET seen = pg_catalog.now(), position = CASE
                WHEN $5::bigint < c.position OR \(isTheTables(offset: "$5::bigint", time: "$6::bigint",
                    sender: "$7::text", payload: "$8::bytea"))
                THEN greatest(c.position, $4::bigint) ELSE c.position END
            WHERE c.grp = $1::text AND c.queue = $2::text AND c.consumer = $3::text
            RETURNING c.position
            """
    )

    /// ``queueAcknowledgeCheckedOne`` of several records: the same parameters, then arrays of their offsets,
    /// times, senders and payloads. Each record is looked up on the primary key by its own subquery: as a join, the
    /// planner hashed every record of the queue.
    static let queueAcknowledgeChecked = PreparedStatement(
        sql: """
            UPDATE wormhole.queue_consumers c SET seen = pg_catalog.now(), position = CASE WHEN NOT EXISTS (
                    SELECT 1 FROM ROWS FROM (pg_catalog.unnest($5::bigint[]), pg_catalog.unnest($6::bigint[]),
                        pg_catalog.unnest($7::text[]), pg_catalog.unnest($8::bytea[])) AS h(o, t, s, p)
                    WHERE h.o >= c.position AND NOT \(isTheTables(offset: "h.o", time: "h.t", sender: "h.s",
                        payload: "h.p")))
                THEN greatest(c.position, $4::bigint) ELSE c.position END
            WHERE c.grp = $1::text AND c.queue = $2::text AND c.consumer = $3::text
            RETURNING c.position
            """
    )

    /// The consumer's position on the server, for the checks of statements that do not update its row.
    private static let storedPosition = """
        (SELECT c.position FROM wormhole.queue_consumers c
        WHERE c.grp = $1::text AND c.queue = $2::text AND c.consumer = $3::text)
        """

    /// ``queueRead`` of one record handed from a notification: the same parameters, then the record's offset,
    /// time, sender and payload. It is `queue_read` acknowledging through the end only when the record is behind
    /// the position already or is the table's record at its offset, and reading from the position as it is
    /// otherwise.
    static let queueReadCheckedOne = PreparedStatement(
        sql: """
            SELECT * FROM wormhole.queue_read($1::text, $2::text, $3::text, CASE
                WHEN $7::bigint < \(storedPosition) OR \(isTheTables(offset: "$7::bigint", time: "$8::bigint",
                    sender: "$9::text", payload: "$10::bytea"))
                THEN $4::bigint END, $5::integer, $6::bigint)
            """
    )

    /// ``queueReadCheckedOne`` of several records: the same parameters, then arrays of their offsets, times,
    /// senders and payloads.
    static let queueReadChecked = PreparedStatement(
        sql: """
            SELECT * FROM wormhole.queue_read($1::text, $2::text, $3::text, CASE WHEN NOT EXISTS (
                    SELECT 1 FROM ROWS FROM (pg_catalog.unnest($7::bigint[]), pg_catalog.unnest($8::bigint[]),
                        pg_catalog.unnest($9::text[]), pg_catalog.unnest($10::bytea[])) AS h(o, t, s, p)
                    WHERE h.o >= \(storedPosition) AND NOT \(isTheTables(offset: "h.o", time: "h.t", sender: "h.s",
                        payload: "h.p")))
                THEN $4::bigint END, $5::integer, $6::bigint)
            """
    )
}
