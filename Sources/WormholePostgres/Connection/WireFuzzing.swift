import Foundation

/// Entry points for fuzzing what this engine reads from the server that another role could have written: the text of
/// notifications (a queue's carried records, live envelopes, seals, the listening connection's snapshot) and the
/// numbers of rows. Not API: the `WormholeFuzzing` target calls them, under libFuzzer and in the corpus test.
///
/// Each takes any bytes, must not crash nor hang, and checks that whatever decodes encodes back to the same thing.
package enum PostgresWireFuzzing {
    /// A queue's append notification (`Q…`), as ``CarriedAppend`` reads it.
    package static func carriedAppend(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        let named = CarriedAppend.identifier(of: text)
        guard let append = CarriedAppend(notification: text) else { return }
        precondition(named == append.identifier, "the queue named without reading the records is another")
        guard let again = CarriedAppend(notification: append.notification), again == append else {
            preconditionFailure("a carried append did not survive re-encoding: \(text)")
        }
        // Offsets one past the last record still fit in a bigint: they are acknowledged as one.
        let records = append.records
        precondition(records.allSatisfy { $0.end <= UInt64(Int64.max) })
    }

    /// A live message, request or reply (`L…`), as ``LiveEnvelope`` reads it.
    package static func liveEnvelope(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        let peeked = LiveEnvelope.peek(text)
        guard let envelope = LiveEnvelope(notification: text) else { return }
        precondition(
            peeked.map { ($0.target, $0.kind, $0.identifier) == (envelope.target, envelope.kind, envelope.identifier) }
                ?? false,
            "a live envelope peeked otherwise than it reads"
        )
        guard LiveEnvelope(notification: envelope.notification) == envelope else {
            preconditionFailure("a live envelope did not survive re-encoding: \(text)")
        }
    }

    /// The key of every fuzzed seal: fixed, so that the fuzzer can find sealed inputs from the seeds.
    static let seal = NotificationSeal(
        inner: (0..<64).map { UInt8(truncatingIfNeeded: $0) ^ 0x36 },
        outer: (0..<64).map { UInt8(truncatingIfNeeded: $0) ^ 0x5c }
    )!

    /// A sealed notification, as the listening connection opens it: its seal under a fixed key, then the replay
    /// guard of a snapshot. The input is the snapshot's text, a newline, the PID the server names as the sender in
    /// decimal, a newline, and the notification.
    package static func sealedNotification(_ bytes: [UInt8]) {
        let parts = bytes.split(separator: UInt8(ascii: "\n"), maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return }
        let snapshot = String(decoding: parts[0], as: UTF8.self)
        let sender = Int32(String(decoding: parts[1], as: UTF8.self)) ?? 0
        let text = String(decoding: parts[2], as: UTF8.self)
        guard let (body, origin, code) = seal.open(text) else { return }
        // Only one spelling of a seal opens: the one the server writes.
        precondition(seal.seal(String(body), origin: origin) == text, "a seal opened that the server never writes")
        guard var guardian = ReplayGuard(snapshot: snapshot) else { return }
        let first = guardian.admit(origin, code: code, sentBy: sender)
        precondition(!first || origin.backendPID == sender, "a seal was taken from another backend than it names")
        precondition(
            !guardian.admit(origin, code: code, sentBy: sender),
            "the same sealed notification was taken twice"
        )
    }

    /// Numbers of rows (the first 8 bytes, big-endian), as ``RowValues`` checks them.
    package static func rowNumber(_ bytes: [UInt8]) {
        guard bytes.count >= 8 else { return }
        let value = bytes.prefix(8).reduce(Int64(0)) { $0 << 8 | Int64($1) }
        let checked = try? RowValues.count(value, "column", of: "table", row: "row")
        precondition(checked == nil || (value >= 0 && value < Int64.max), "a count out of range was taken")
        if let checked {
            // One past a checked count is still sent back as a bigint.
            precondition((try? RowValues.bigint(checked + 1, "one past")) == value + 1)
        }
    }

    /// The entry points, for a caller that picks one by a byte of its input.
    package enum Entry: CaseIterable, Sendable {
        case carriedAppend, liveEnvelope, sealedNotification, rowNumber
    }

    /// Runs `entry` on `bytes`.
    package static func run(_ entry: Entry, _ bytes: [UInt8]) {
        switch entry {
        case .carriedAppend: carriedAppend(bytes)
        case .liveEnvelope: liveEnvelope(bytes)
        case .sealedNotification: sealedNotification(bytes)
        case .rowNumber: rowNumber(bytes)
        }
    }

    /// Valid inputs of each entry point, to seed a corpus.
    package static func seeds() -> [(entry: Entry, bytes: [UInt8])] {
        let append = CarriedAppend(
            identifier: "jobs",
            firstOffset: 7,
            sender: "app[1]",
            timestampNanoseconds: 1_700_000_000_000_000_000,
            payloads: [Data(#"{"n":1}"#.utf8), Data("x".utf8)]
        ).notification
        var envelope = LiveEnvelope(kind: .request, identifier: "echo")
        envelope.target = "endpoint-1"
        envelope.requestID = "r-1"
        envelope.replyTo = "hub-1"
        envelope.sender = "app"
        envelope.body = Data("42".utf8).base64EncodedString()
        let sealed = seal.seal(append, origin: .init(backendPID: 4242, transaction: 987_654))
        return [
            (.carriedAppend, Array(append.utf8)),
            (.liveEnvelope, Array(envelope.notification.utf8)),
            (.sealedNotification, Array("987000:987700:987654\n4242\n\(sealed)".utf8)),
            (.rowNumber, [0, 0, 0, 0, 0, 0, 0x30, 0x39]),
        ]
    }
}
