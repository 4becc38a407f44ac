import Foundation
import NIOCore
import NIOFoundationCompat
import PostgresNIO
import WormholeKit

/// Mailboxes in `wormhole.mailboxes`: one row per identifier, holding the newest message.
///
/// A write replaces the row and adds one to its sequence in one statement, so a reader sees the previous message or
/// the new one, whole. Emptying a mailbox keeps its row with no payload, so that its sequence only grows.
final class PostgresTransiting: Transiting {
    let engine: PostgresCore
    /// The largest message a mailbox accepts, as the directory engine's.
    static let sizeLimit = 64 << 20

    init(engine: PostgresCore) {
        self.engine = engine
    }

    func writeMessage(_ payload: Data, sender: String, identifier: String) throws(WormholeError) -> Envelope {
        try MessageIdentifier.validate(identifier)
        guard payload.count <= Self.sizeLimit else {
            throw WormholeError(
                .messageTooLarge,
                "The message is \(payload.count) bytes; a mailbox accepts up to 64 MiB.",
                identifier: identifier
            )
        }
        let now = Int64(Date().timeIntervalSince1970 * 1e9)
        let name = "mailbox." + identifier
        // The notification rides the write's statement: one round trip. The wormhole's post of the same name, next
        // on this thread, then has nothing left to do (see `PostgresNotifier.post`).
        let rows = try engine.connections.execute(
            .mailboxWrite,
            [
                PostgresData(string: engine.group), PostgresData(string: identifier), PostgresData(string: sender),
                PostgresData(int64: now), PostgresData(type: .bytea, value: ByteBuffer(data: payload)),
                PostgresData(string: ""), PostgresData(string: "n" + name),
            ],
            doing: "writing the mailbox \(identifier)"
        )
        NotifiedByWrite.record(name)
        let sequence = try decode(Int64.self, rows.first, doing: "writing the mailbox \(identifier)")
        return try envelope(sequence, sender: sender, time: now, payload: payload, identifier: identifier)
    }

    func readMessage(identifier: String) throws(WormholeError) -> Envelope? {
        try MessageIdentifier.validate(identifier)
        let rows = try engine.connections.execute(
            .mailboxRead,
            [PostgresData(string: engine.group), PostgresData(string: identifier)],
            doing: "reading the mailbox \(identifier)"
        )
        guard let found = rows.first else { return nil }
        let (sequence, sender, time, payload): (Int64, String, Int64, ByteBuffer)
        do {
            var columns = found.columns()
            sequence = try columns.decode(Int64.self)
            sender = try columns.decode(String.self)
            time = try columns.decode(Int64.self)
            payload = try columns.decode(ByteBuffer.self)
        } catch {
            throw WormholeError(
                .corruptMessage,
                "The mailbox row of \(identifier) has unexpected columns: \(error).",
                identifier: identifier,
                underlyingError: SendableDescription(error)
            )
        }
        // A writer of this package never stores more; a reader takes no more into memory.
        guard payload.readableBytes <= Self.sizeLimit else {
            throw RowValues.corrupt(
                "a payload of \(payload.readableBytes) bytes (past 64 MiB)",
                of: "mailboxes",
                row: row(identifier),
                identifier: identifier
            )
        }
        return try envelope(
            sequence,
            sender: sender,
            time: time,
            payload: Data(buffer: payload),
            identifier: identifier
        )
    }

    /// The envelope of a mailbox's row, its sequence checked.
    private func envelope(
        _ sequence: Int64,
        sender: String,
        time: Int64,
        payload: Data,
        identifier: String
    ) throws(WormholeError) -> Envelope {
        Envelope(
            sequence: try RowValues.count(
                sequence,
                "sequence",
                of: "mailboxes",
                row: row(identifier),
                identifier: identifier
            ),
            generation: 0,
            sender: sender,
            timestampNanoseconds: time,
            payload: payload
        )
    }

    /// What names a mailbox's row in an error.
    private func row(_ identifier: String) -> String { "the mailbox \(identifier) of group \(engine.group)" }

    func deleteMessage(identifier: String) throws(WormholeError) {
        NotifiedByWrite.forget()
        try MessageIdentifier.validate(identifier)
        try engine.connections.query(
            """
            UPDATE wormhole.mailboxes SET payload = NULL
            WHERE grp = \(engine.group) AND identifier = \(identifier)
            """,
            doing: "emptying the mailbox \(identifier)"
        )
    }

    func deleteAllMessages() throws(WormholeError) {
        NotifiedByWrite.forget()
        try engine.connections.query(
            "UPDATE wormhole.mailboxes SET payload = NULL WHERE grp = \(engine.group) AND payload IS NOT NULL",
            doing: "emptying every mailbox"
        )
    }

    func identifiers() throws(WormholeError) -> [String] {
        let rows = try engine.connections.query(
            """
            SELECT identifier FROM wormhole.mailboxes WHERE grp = \(engine.group) AND payload IS NOT NULL
            ORDER BY identifier COLLATE "C"
            """,
            doing: "listing the mailboxes"
        )
        var identifiers: [String] = []
        for row in rows { identifiers.append(try decode(String.self, row, doing: "listing the mailboxes")) }
        return identifiers
    }
}

/// Posts and observes names over the group's notification channel.
final class PostgresNotifier: Notifier {
    let engine: PostgresCore

    init(engine: PostgresCore) {
        self.engine = engine
    }

    func post(_ name: String) throws(WormholeError) {
        // The write just made on this thread notified this name already.
        if NotifiedByWrite.take(name) { return }
        try engine.connections.execute(
            .notifyHint,
            [PostgresData(string: engine.group), PostgresData(string: ""), PostgresData(string: "n" + name)],
            doing: "notifying \(name)"
        )
    }

    func observe(_ name: String, handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        try engine.hub.observe(name, handler: handler)
    }
}

/// The name a mailbox write on this thread notified in its own statement, until the wormhole's post of it.
enum NotifiedByWrite {
    private static let key = "wormhole.postgres.notified"

    static func record(_ name: String) { Thread.current.threadDictionary[key] = name }

    static func forget() { Thread.current.threadDictionary.removeObject(forKey: key) }

    /// Whether `name` was notified by this thread's last write; forgets it either way.
    static func take(_ name: String) -> Bool {
        let dictionary = Thread.current.threadDictionary
        defer { dictionary.removeObject(forKey: key) }
        return dictionary[key] as? String == name
    }
}

extension PreparedStatement {
    /// A mailbox's write and its notification, in one statement: the group, the identifier, the sender, the time,
    /// the payload, the channel's suffix (empty: the group's channel, as its row names it) and the notification.
    /// Returns the new sequence number. (The channel is read in the statement itself, not through
    /// `wormhole.notify`: a function call on every write cost the mailbox about a tenth of its round trip.)
    static let mailboxWrite = PreparedStatement(
        sql: """
            WITH written AS (
                INSERT INTO wormhole.mailboxes AS m (grp, identifier, sequence, sender, time_ns, payload)
                VALUES ($1::text, $2::text, 1, $3::text, $4::bigint, $5::bytea)
                ON CONFLICT (grp, identifier) DO UPDATE SET sequence = m.sequence + 1, sender = EXCLUDED.sender,
                    time_ns = EXCLUDED.time_ns, payload = EXCLUDED.payload
                RETURNING sequence)
            SELECT sequence, pg_catalog.pg_notify(
                (SELECT g.channel FROM wormhole.groups g WHERE g.grp = $1::text) || $6::text, $7::text) IS NULL
            FROM written
            """
    )

    /// A mailbox's message, if it holds one: the group and the identifier.
    static let mailboxRead = PreparedStatement(
        sql: """
            SELECT sequence, sender, time_ns, payload FROM wormhole.mailboxes
            WHERE grp = $1::text AND identifier = $2::text AND payload IS NOT NULL
            """
    )
}
