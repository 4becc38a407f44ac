import Dispatch
import Foundation
import PostgresNIO
import Synchronization
import WormholeKit

/// A live message, request or reply as it rides a notification: `L`, then its fields, each a netstring (its length
/// in UTF-8 bytes in decimal, `:`, the bytes) but for two one-character fields (FORMAT-POSTGRES.md, "Notifications on
/// PostgreSQL").
///
/// The target comes first, so that the server can put a request's chosen responder in front of the rest; a reader
/// finds the kind and the identifier before the rest, and skips a message that no endpoint of its process wants
/// without reading the rest. (It was JSON: decoding it was the largest cost of a live message on the client.)
struct LiveEnvelope: Sendable, Equatable {
    enum Kind: Character, Sendable {
        case message = "m"
        case request = "q"
        case reply = "r"
    }
    var kind: Kind
    var identifier: String
    /// A request's responder endpoint, or a reply's requesting hub.
    var target: String = ""
    var requestID: String = ""
    /// A request's requesting hub.
    var replyTo: String = ""
    var sender: String = ""
    /// A reply that carries the responder's failure.
    var failed = false
    /// The bytes, in Base64, when they fit in a notification.
    var body: String?
    /// Else the id of the row in `wormhole.live_bodies` that holds them.
    var bodyID: String?

    init(kind: Kind, identifier: String) {
        self.kind = kind
        self.identifier = identifier
    }

    /// The notification's first character.
    static let marker: Character = "L"

    /// The envelope of a notification; nil when it is not one, or is damaged.
    init?(notification: String) {
        var reader = NetstringReader(notification)
        guard reader.character() == Self.marker, let target = reader.field(), let head = Self.readHead(&reader),
            let rest = Self.readRest(&reader), reader.isAtEnd
        else { return nil }
        self.init(kind: head.kind, identifier: head.identifier)
        self.target = target
        (requestID, replyTo, sender, failed, body, bodyID) = rest
    }

    /// The target, kind and identifier of a notification, without reading the rest.
    static func peek(_ notification: String) -> (target: String, kind: Kind, identifier: String)? {
        var reader = NetstringReader(notification)
        guard reader.character() == marker, let target = reader.field(), let head = readHead(&reader) else {
            return nil
        }
        return (target, head.kind, head.identifier)
    }

    private static func readHead(_ reader: inout NetstringReader) -> (kind: Kind, identifier: String)? {
        guard let kind = reader.character().flatMap(Kind.init(rawValue:)), let identifier = reader.field() else {
            return nil
        }
        return (kind, identifier)
    }

    private static func readRest(
        _ reader: inout NetstringReader
    ) -> (String, String, String, Bool, String?, String?)? {
        guard let requestID = reader.field(), let replyTo = reader.field(), let sender = reader.field(),
            let failed = reader.character(), failed == "0" || failed == "1", let bodyKind = reader.character()
        else { return nil }
        switch bodyKind {
        case "-": return (requestID, replyTo, sender, failed == "1", nil, nil)
        case "b": return reader.field().map { (requestID, replyTo, sender, failed == "1", $0, nil) }
        case "x": return reader.field().map { (requestID, replyTo, sender, failed == "1", nil, $0) }
        default: return nil
        }
    }

    /// The notification: the marker, the target, then ``notificationAfterTarget``.
    var notification: String { String(Self.marker) + netstring(target) + notificationAfterTarget }

    /// Everything after the target: the server puts a request's chosen responder in front of it.
    var notificationAfterTarget: String {
        var text = String(kind.rawValue) + netstring(identifier)
        text += netstring(requestID) + netstring(replyTo) + netstring(sender)
        text += failed ? "1" : "0"
        if let body {
            text += "b" + netstring(body)
        } else if let bodyID {
            text += "x" + netstring(bodyID)
        } else {
            text += "-"
        }
        return text
    }

}

/// A netstring: the length of `text` in UTF-8 bytes in decimal, `:`, then `text`.
func netstring(_ text: String) -> String { "\(text.utf8.count):" + text }

/// Reads a notification's fields from its UTF-8 bytes: single ASCII characters, netstrings and decimal numbers.
struct NetstringReader {
    let bytes: String.UTF8View
    var index: String.UTF8View.Index

    init(_ text: String) {
        bytes = text.utf8
        index = bytes.startIndex
    }

    var isAtEnd: Bool { index == bytes.endIndex }

    /// One ASCII character.
    mutating func character() -> Character? {
        guard index < bytes.endIndex, bytes[index] < 0x80 else { return nil }
        defer { index = bytes.index(after: index) }
        return Character(Unicode.Scalar(bytes[index]))
    }

    /// Decimal digits up to `terminator` (consumed), at most `maximumDigits` of them.
    mutating func number(upTo terminator: UInt8 = UInt8(ascii: ":"), maximumDigits: Int = 6) -> UInt64? {
        var value: UInt64 = 0
        var digits = 0
        while index < bytes.endIndex, bytes[index] != terminator {
            let byte = bytes[index]
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9"), digits < maximumDigits else { return nil }
            value = value * 10 + UInt64(byte - UInt8(ascii: "0"))
            digits += 1
            index = bytes.index(after: index)
        }
        guard digits > 0, index < bytes.endIndex else { return nil }
        index = bytes.index(after: index)
        return value
    }

    /// A netstring's text; nil when its length is missing, too long for what is left, or splits a character.
    mutating func field() -> String? {
        guard let length = number() else { return nil }
        guard let end = bytes.index(index, offsetBy: Int(length), limitedBy: bytes.endIndex),
            let text = String(bytes[index..<end])
        else { return nil }
        index = end
        return text
    }
}

/// Live messages and requests over `NOTIFY`: to whoever listens now, nothing kept.
///
/// Each listening or responding endpoint is a row of `wormhole.live_endpoints` with the `alive_key` of its process's
/// listening connection: an advisory lock that session holds while it lives. A send counts the endpoints whose lock
/// is held (a shared try of it fails), in the call that notifies, so that nobody listening is `notReachable` at once.
/// Bodies up to ``inlineLimit`` bytes ride the notification; larger ones wait in `wormhole.live_bodies` for a
/// minute.
final class PostgresLiveTransport: LiveTransport {
    let engine: PostgresCore
    let sender: String
    /// The largest body sent inside a notification (PostgreSQL's payloads stop under 8,000 bytes; Base64 grows by
    /// a third).
    static let inlineLimit = 5_000
    /// The largest notification sent: PostgreSQL refuses 8,000 bytes, and a request's gains its responder's id
    /// and jsonb's spacing on the way.
    static let notificationLimit = 7_500

    init(engine: PostgresCore, sender: String) {
        self.engine = engine
        self.sender = sender
    }

    private func notReachable(_ identifier: String, _ what: String) -> WormholeError {
        WormholeError(
            .notReachable,
            "No process \(what) \"\(identifier)\" right now; nothing was sent.",
            identifier: identifier
        )
    }

    /// Puts the body in the envelope, or in a row when the notification would be too large.
    private func attach(_ payload: Data, to envelope: inout LiveEnvelope) throws(WormholeError) {
        if payload.count <= Self.inlineLimit {
            var inline = envelope
            inline.body = payload.base64EncodedString()
            if inline.notification.utf8.count <= Self.notificationLimit {
                envelope = inline
                return
            }
        }
        let id = NotificationHub.randomID()
        try engine.connections.query(
            """
            WITH old AS (DELETE FROM wormhole.live_bodies
                WHERE grp = \(engine.group) AND created < now() - interval '1 minute')
            INSERT INTO wormhole.live_bodies (grp, id, body) VALUES (\(engine.group), \(id), \(ByteBuffer(data: payload)))
            """,
            doing: "storing a live message's body"
        )
        envelope.bodyID = id
    }

    /// The envelope's bytes, from the notification or from its row.
    func body(of envelope: LiveEnvelope) throws(WormholeError) -> Data {
        if let body = envelope.body {
            guard let bytes = Data(base64Encoded: body) else {
                throw WormholeError(.corruptMessage, "A live message's body is not Base64.")
            }
            return bytes
        }
        guard let id = envelope.bodyID else { return Data() }
        let rows = try engine.connections.query(
            "SELECT body FROM wormhole.live_bodies WHERE grp = \(engine.group) AND id = \(id)",
            doing: "reading a live message's body"
        )
        guard let row = rows.first else {
            throw WormholeError(
                .notReachable,
                "A live message's body was gone before it was read (bodies are kept for a minute).",
                identifier: envelope.identifier
            )
        }
        return Data(buffer: try decode(ByteBuffer.self, row, doing: "reading a live message's body"))
    }

    func send(_ payload: Data, identifier: String) throws(WormholeError) -> Int {
        var envelope = LiveEnvelope(kind: .message, identifier: identifier)
        envelope.sender = sender
        try attach(payload, to: &envelope)
        // Counting and notifying in one call: what is counted is what was listening at the notification.
        let rows = try engine.connections.execute(
            .liveSend,
            [
                PostgresData(string: engine.group), PostgresData(string: identifier),
                PostgresData(string: NotificationHub.liveSuffix(for: identifier)),
                PostgresData(string: envelope.notification),
            ],
            doing: "sending a live message"
        )
        let count = Int(try decode(Int64.self, rows.first, doing: "sending a live message"))
        guard count > 0 else { throw notReachable(identifier, "is listening for") }
        return count
    }

    func listen(
        identifier: String,
        handler: @escaping @Sendable (LiveMessage) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let logger = engine.logger
        return try listen(identifier: identifier, handler: handler) { error in
            logger.warning("PostgreSQL engine: a live message for \(identifier) was lost: \(error)")
        }
    }

    func listen(
        identifier: String,
        handler: @escaping @Sendable (LiveMessage) -> Void,
        lost: @escaping @Sendable (WormholeError) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        try endpoint(identifier: identifier, kind: "listen") { envelope in
            do throws(WormholeError) {
                handler(LiveMessage(sender: envelope.sender, payload: try self.body(of: envelope)))
            } catch {
                lost(error)
            }
        }
    }

    /// Registers an endpoint whose envelopes are handled one at a time on a thread of its own, until the returned
    /// observation is cancelled or released. The thread is a callback driver (`DriverThread`): the listener's
    /// callbacks with the default execution run on it, with no second hand-off to the listener's queue. Envelopes
    /// that came before the cancel but were not handled yet go to `dropped`, on the same thread.
    private func endpoint(
        identifier: String,
        kind: String,
        handle: @escaping @Sendable (LiveEnvelope) -> Void,
        dropped: @escaping @Sendable (LiveEnvelope) -> Void = { _ in }
    ) throws(WormholeError) -> NotifierObservation {
        let thread = DriverThread(name: "wh-pg-\(kind)")
        let cancelled = Atomic<Bool>(false)
        let endpoint = NotificationHub.Endpoint(identifier: identifier, kind: kind) { envelope in
            thread.submit {
                guard !cancelled.load(ordering: .acquiring) else { return dropped(envelope) }
                handle(envelope)
            }
        }
        let id: String
        do throws(WormholeError) {
            id = try engine.hub.register(endpoint)
        } catch {
            thread.stop()
            throw error
        }
        return NotifierObservation { [hub = engine.hub] in
            cancelled.store(true, ordering: .releasing)
            hub.unregister(id)
            // What came before the cancel still goes to `dropped`: a request is answered, not left to time out.
            thread.finish()
        }
    }

    func request(_ payload: Data, identifier: String, timeout: Duration) -> Result<Data, WormholeError> {
        // Every wait on the server within the request ends with its time-out, not the engine's (30 s by default).
        let start = ContinuousClock.now
        let result = Connections.$callTimeLimit.withValue((start, timeout)) { () -> Result<Data, WormholeError> in
            do throws(WormholeError) {
                return .success(try requesting(payload, identifier: identifier, timeout: timeout, start: start))
            } catch {
                return .failure(error)
            }
        }
        if case .failure(let error) = result, error.code == .serverUnavailable, start.duration(to: .now) >= timeout {
            return .failure(
                WormholeError(
                    .timedOut,
                    "No reply within \(timeout): the server did not answer in time (\(error.message))",
                    identifier: identifier,
                    underlyingError: error
                )
            )
        }
        return result
    }

    private func requesting(
        _ payload: Data,
        identifier: String,
        timeout: Duration,
        start: ContinuousClock.Instant
    ) throws(WormholeError) -> Data {
        // The time-out counts from the call, and is compared, never added to a clock reading: `.seconds(Int64.max)`
        // must mean "as long as it takes", not a trap.
        let hub = engine.hub
        _ = try hub.listeningBackend()
        var envelope = LiveEnvelope(kind: .request, identifier: identifier)
        envelope.sender = sender
        envelope.requestID = NotificationHub.randomID()
        envelope.replyTo = hub.replyEndpoint
        try attach(payload, to: &envelope)
        let answer = Locked<LiveEnvelope?>(nil)
        let answered = DispatchSemaphore(value: 0)
        hub.replies.withLock {
            $0[envelope.requestID] = { reply in
                answer.withLock { $0 = reply }
                answered.signal()
            }
        }
        defer { _ = hub.replies.withLock { $0.removeValue(forKey: envelope.requestID) } }
        let afterTarget = envelope.notificationAfterTarget
        // One responder, chosen at random among the live ones, in the statement that notifies it.
        let rows = try engine.connections.execute(
            .liveRequest,
            [
                PostgresData(string: engine.group), PostgresData(string: identifier),
                PostgresData(string: NotificationHub.liveSuffix(for: identifier)), PostgresData(string: afterTarget),
            ],
            doing: "sending a request"
        )
        guard let row = rows.first else { throw notReachable(identifier, "answers") }
        let responderKey = try decode(Int64.self, row, doing: "sending a request")
        while true {
            let remaining = timeout - start.duration(to: .now)
            if remaining <= .zero {
                throw WormholeError(.timedOut, "No reply within \(timeout).", identifier: identifier)
            }
            if answered.wait(timeout: .now() + min(remaining, .milliseconds(500)).dispatchInterval) == .success {
                break
            }
            // Too little time left to ask the server anything: wait the rest out (a query would only end with the
            // time-out, closing its connection).
            if timeout - start.duration(to: .now) < .milliseconds(100) { continue }
            // A responder whose process went away never answers: say so instead of waiting for the time-out.
            let alive = try engine.connections.query(
                "SELECT NOT pg_try_advisory_xact_lock_shared(\(responderKey))",
                doing: "checking the responder"
            )
            if try !decode(Bool.self, alive.first, doing: "checking the responder") {
                throw WormholeError(
                    .remoteFailure,
                    "The responder's process went away before replying.",
                    identifier: identifier
                )
            }
        }
        guard let reply = answer.withLock({ $0 }) else {
            throw WormholeError(.remoteFailure, "The responder did not answer.", identifier: identifier)
        }
        let bytes = try body(of: reply)
        if reply.failed {
            throw WormholeError(
                .remoteFailure,
                "The responder failed: \(String(decoding: bytes, as: UTF8.self))",
                identifier: identifier
            )
        }
        return bytes
    }

    func respond(
        identifier: String,
        handler: @escaping @Sendable (LiveRequest) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let engine = engine
        return try endpoint(
            identifier: identifier,
            kind: "respond",
            handle: { envelope in
                let payload: Data
                do {
                    payload = try self.body(of: envelope)
                } catch {
                    Self.answer(envelope, failed: true, Data("the request's body was lost: \(error)".utf8), engine)
                    return
                }
                handler(
                    LiveRequest(sender: envelope.sender, payload: payload) { answer in
                        switch answer {
                        case .reply(let bytes): Self.answer(envelope, failed: false, bytes, engine)
                        case .failure(let description):
                            Self.answer(envelope, failed: true, Data(description.utf8), engine)
                        }
                    }
                )
            },
            dropped: { envelope in
                Self.answer(envelope, failed: true, Data("the responder stopped before answering".utf8), engine)
            }
        )
    }

    /// Sends a reply without waiting for it: an answer may come from any thread, including Swift's cooperative pool.
    private static func answer(_ request: LiveEnvelope, failed: Bool, _ bytes: Data, _ engine: PostgresCore) {
        // To the requester's reply channel: no other process of the group hears it.
        let replySuffix = NotificationHub.replySuffix(request.replyTo)
        var reply = LiveEnvelope(kind: .reply, identifier: request.identifier)
        reply.target = request.replyTo
        reply.requestID = request.requestID
        reply.failed = failed
        var inline = reply
        inline.body = bytes.base64EncodedString()
        if bytes.count <= inlineLimit, inline.notification.utf8.count <= notificationLimit {
            reply = inline
            engine.connections.submit(
                .notifySealed,
                [
                    PostgresData(string: engine.group), PostgresData(string: replySuffix),
                    PostgresData(string: reply.notification),
                ],
                doing: "replying to a request"
            )
        } else {
            let id = NotificationHub.randomID()
            reply.bodyID = id
            engine.connections.submit(
                """
                WITH body AS (INSERT INTO wormhole.live_bodies (grp, id, body)
                    VALUES (\(engine.group), \(id), \(ByteBuffer(data: bytes))) RETURNING 1)
                SELECT wormhole.notify_sealed(\(engine.group), \(replySuffix), \(reply.notification)) FROM body
                """,
                doing: "replying to a request"
            )
        }
    }
}

extension PreparedStatement {
    /// A live message (`wormhole.live_send_sealed`): the group, the identifier, its channel's suffix and the
    /// notification, which the server seals.
    static let liveSend = PreparedStatement(
        sql: "SELECT wormhole.live_send_sealed($1::text, $2::text, $3::text, $4::text)"
    )

    /// A request: one responder of the identifier, chosen at random among the live ones, notified in the same
    /// statement (the group, the identifier, its channel's suffix and the notification after its target), sealed by
    /// the server. Returns the responder's liveness key, or no row when none answers.
    static let liveRequest = PreparedStatement(
        sql: """
            WITH chosen AS (
                SELECT e.endpoint, e.alive_key FROM wormhole.live_endpoints e
                WHERE e.grp = $1::text AND e.identifier = $2::text AND e.kind = 'respond'
                    AND e.alive_key IS NOT NULL AND NOT pg_catalog.pg_try_advisory_xact_lock_shared(e.alive_key)
                ORDER BY pg_catalog.random() LIMIT 1)
            SELECT c.alive_key, (SELECT wormhole.notify_sealed($1::text, $3::text,
                'L' || pg_catalog.octet_length(c.endpoint) || ':' || c.endpoint || $4::text
            )) IS NULL FROM chosen c
            """
    )
}
