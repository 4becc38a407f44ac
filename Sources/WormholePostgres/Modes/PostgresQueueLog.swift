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
        let count = Int64(buffers.count)
        try engine.connections.query(
            """
            WITH head AS (
                INSERT INTO wormhole.queues AS q (grp, queue, next_offset) VALUES (\(engine.group), \(identifier), \(count))
                ON CONFLICT (grp, queue) DO UPDATE SET next_offset = q.next_offset + EXCLUDED.next_offset
                RETURNING q.next_offset - \(count) AS first),
            appended AS (
                INSERT INTO wormhole.queue_records (grp, queue, "offset", sender, time_ns, payload)
                SELECT \(engine.group), \(identifier), head.first + p.n - 1, \(sender), \(now), p.payload
                FROM head, unnest(\(buffers)::bytea[]) WITH ORDINALITY AS p(payload, n)
                RETURNING 1)
            SELECT (SELECT count(*) FROM appended), pg_notify(\(engine.channel), \("n" + notificationName)) IS NULL
            """,
            doing: "appending to the queue \(identifier)"
        )
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
        return PostgresQueueCursor(log: self, consumer: consumer, position: UInt64(position))
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
            do {
                let (name, position, bytes, count) = try row.decode((String, Int64, Int64, Int64).self)
                consumers.append(
                    QueueStatus.Consumer(
                        name: name,
                        offset: UInt64(position),
                        lagBytes: UInt64(bytes),
                        lagMessages: Int(count)
                    )
                )
            } catch {
                throw WormholeError(.serverRejected, "Unexpected columns while \(what): \(error).")
            }
        }
        return QueueStatus(
            identifier: identifier,
            endOffset: UInt64(try decode(Int64.self, end.first, doing: what)),
            consumers: consumers
        )
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

    func read(maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        let engine = log.engine
        let what = "reading the queue \(log.identifier) as \(consumer)"
        // From the position stored on the server, which only this consumer's acknowledgements move.
        let rows = try engine.connections.query(
            """
            SELECT "offset", sender, time_ns, payload FROM (
                SELECT r."offset", r.sender, r.time_ns, r.payload,
                    sum(octet_length(r.payload)) OVER (ORDER BY r."offset") - octet_length(r.payload) AS before
                FROM wormhole.queue_records r
                WHERE r.grp = \(engine.group) AND r.queue = \(log.identifier)
                    AND r."offset" >= (SELECT position FROM wormhole.queue_consumers
                        WHERE grp = \(engine.group) AND queue = \(log.identifier) AND consumer = \(consumer))
                ORDER BY r."offset" LIMIT \(max(1, maximumCount))) batch
            WHERE before < \(PostgresQueueLog.readLimit)
            ORDER BY "offset"
            """,
            doing: what
        )
        var records: [QueueRecord] = []
        records.reserveCapacity(rows.count)
        for row in rows {
            do {
                let (offset, sender, time, payload) = try row.decode((Int64, String, Int64, ByteBuffer).self)
                records.append(
                    QueueRecord(
                        offset: UInt64(offset),
                        end: UInt64(offset) + 1,
                        sender: sender,
                        timestampNanoseconds: time,
                        payload: Data(buffer: payload)
                    )
                )
            } catch {
                throw WormholeError(
                    .corruptMessage,
                    "Unexpected columns while \(what): \(error).",
                    identifier: log.identifier
                )
            }
        }
        return records
    }

    func acknowledge(through end: UInt64) throws(WormholeError) {
        let engine = log.engine
        let rows = try engine.connections.query(
            """
            UPDATE wormhole.queue_consumers SET position = greatest(position, \(Int64(end))), seen = now()
            WHERE grp = \(engine.group) AND queue = \(log.identifier) AND consumer = \(consumer)
            RETURNING position
            """,
            doing: "acknowledging \(log.identifier) as \(consumer)"
        )
        guard let row = rows.first else {
            throw WormholeError(
                .serverRejected,
                "The consumer \(consumer) of \(log.identifier) is no longer registered: it stayed away longer than "
                    + "the queue's retention and was dropped. Open it again to start from the oldest record kept.",
                identifier: log.identifier
            )
        }
        let position = try decode(Int64.self, row, doing: "acknowledging")
        stored.withLock { $0 = UInt64(position) }
        // Records every consumer has passed are deleted as consumers move on, not only when someone asks.
        let due = lastReclaim.withLock { last in
            guard ContinuousClock.now - last >= Self.reclaimInterval else { return false }
            last = .now
            return true
        }
        if due {
            do { try log.reclaimSpace() } catch {
                engine.logger.debug("PostgreSQL engine: reclaiming space in \(log.identifier) failed: \(error)")
            }
        }
    }

    func observeAppends(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        try log.engine.hub.observe(log.notificationName, handler: handler)
    }
}
