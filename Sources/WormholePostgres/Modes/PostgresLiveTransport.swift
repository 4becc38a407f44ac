import Dispatch
import Foundation
import PostgresNIO
import Synchronization
import WormholeKit

/// A live message, request or reply as it rides a notification: `l` then JSON.
struct LiveEnvelope: Codable, Sendable {
    enum Kind: String, Codable, Sendable {
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

    private enum CodingKeys: String, CodingKey {
        case kind = "k"
        case identifier = "i"
        case target = "t"
        case requestID = "q"
        case replyTo = "r"
        case sender = "s"
        case failed = "f"
        case body = "b"
        case bodyID = "x"
    }

    init(kind: Kind, identifier: String) {
        self.kind = kind
        self.identifier = identifier
    }

    init?(notification: String) {
        guard notification.first == "l",
            let decoded = try? JSONDecoder().decode(Self.self, from: Data(notification.utf8.dropFirst()))
        else { return nil }
        self = decoded
    }

    /// Base64's slashes stay as they are: escaped, they would double in size.
    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .withoutEscapingSlashes
        return encoder
    }()

    var notification: String {
        // Encoding strings and booleans cannot fail.
        "l" + String(decoding: (try? Self.encoder.encode(self)) ?? Data(), as: UTF8.self)
    }
}

/// Live messages and requests over `NOTIFY`: to whoever listens now, nothing kept.
///
/// Each listening or responding endpoint is a row of `wormhole.live_endpoints` naming the backend of its
/// process's listening connection (its pid and start time; the server hides the start time of another role's
/// backends, and then the pid alone is checked); a send counts the endpoints whose backend is alive, in the statement that
/// notifies, so that nobody listening is `notReachable` at once. Bodies up to ``inlineLimit`` bytes ride the
/// notification; larger ones wait in `wormhole.live_bodies` for a minute.
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
        // Counting and notifying in one statement: what is counted is what was listening at the notification.
        let rows = try engine.connections.query(
            """
            SELECT t.n, (SELECT pg_notify(\(engine.channel), \(envelope.notification)) WHERE t.n > 0) IS NULL
            FROM (SELECT count(*) AS n FROM wormhole.live_endpoints e
                WHERE e.grp = \(engine.group) AND e.identifier = \(identifier) AND e.kind = 'listen'
                    AND EXISTS (SELECT 1 FROM pg_stat_get_activity(e.backend_pid) a
                        WHERE a.backend_start IS NULL OR a.backend_start = e.backend_start)) t
            """,
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
        return try endpoint(identifier: identifier, kind: "listen") { envelope in
            do {
                handler(LiveMessage(sender: envelope.sender, payload: try self.body(of: envelope)))
            } catch {
                logger.warning("PostgreSQL engine: a live message for \(identifier) was lost: \(error)")
            }
        }
    }

    /// Registers an endpoint whose envelopes are handled one at a time on a serial queue of its own, until the
    /// returned observation is cancelled or released.
    private func endpoint(
        identifier: String,
        kind: String,
        handle: @escaping @Sendable (LiveEnvelope) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let queue = DispatchQueue(label: "wormhole.postgres.\(kind)")
        let cancelled = Atomic<Bool>(false)
        let endpoint = NotificationHub.Endpoint(identifier: identifier, kind: kind) { envelope in
            queue.async {
                guard !cancelled.load(ordering: .acquiring) else { return }
                handle(envelope)
            }
        }
        let id = try engine.hub.register(endpoint)
        return NotifierObservation { [hub = engine.hub] in
            cancelled.store(true, ordering: .releasing)
            hub.unregister(id)
        }
    }

    func request(_ payload: Data, identifier: String, timeout: Duration) -> Result<Data, WormholeError> {
        do {
            return .success(try requesting(payload, identifier: identifier, timeout: timeout))
        } catch {
            return .failure(error)
        }
    }

    private func requesting(_ payload: Data, identifier: String, timeout: Duration) throws(WormholeError) -> Data {
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
        let json = String(envelope.notification.dropFirst())
        // One responder, chosen at random among the live ones, in the statement that notifies it.
        let rows = try engine.connections.query(
            """
            WITH chosen AS (
                SELECT e.endpoint, e.backend_pid, e.backend_start FROM wormhole.live_endpoints e
                WHERE e.grp = \(engine.group) AND e.identifier = \(identifier) AND e.kind = 'respond'
                    AND EXISTS (SELECT 1 FROM pg_stat_get_activity(e.backend_pid) a
                        WHERE a.backend_start IS NULL OR a.backend_start = e.backend_start)
                ORDER BY random() LIMIT 1)
            SELECT c.backend_pid, c.backend_start::text, (SELECT pg_notify(\(engine.channel),
                'l' || jsonb_set(\(json)::jsonb, '{t}', to_jsonb(c.endpoint))::text
            )) IS NULL FROM chosen c
            """,
            doing: "sending a request"
        )
        guard let row = rows.first else { throw notReachable(identifier, "answers") }
        let responder: (pid: Int32, start: String)
        do {
            let (pid, start, _) = try row.decode((Int32, String, Bool?).self)
            responder = (pid, start)
        } catch {
            throw WormholeError(.serverRejected, "Unexpected columns while sending a request: \(error).")
        }
        let deadline = ContinuousClock.now + timeout
        while true {
            let remaining = deadline - .now
            if remaining <= .zero {
                throw WormholeError(.timedOut, "No reply within \(timeout).", identifier: identifier)
            }
            if answered.wait(timeout: .now() + min(remaining, .milliseconds(500)).dispatchInterval) == .success {
                break
            }
            // A responder whose process went away never answers: say so instead of waiting for the time-out.
            let alive = try engine.connections.query(
                """
                SELECT EXISTS (SELECT 1 FROM pg_stat_get_activity(\(responder.pid))
                    WHERE backend_start IS NULL OR backend_start::text = \(responder.start))
                """,
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
        return try endpoint(identifier: identifier, kind: "respond") { envelope in
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
                    case .failure(let description): Self.answer(envelope, failed: true, Data(description.utf8), engine)
                    }
                }
            )
        }
    }

    /// Sends a reply without waiting for it: an answer may come from any thread, including Swift's cooperative pool.
    private static func answer(_ request: LiveEnvelope, failed: Bool, _ bytes: Data, _ engine: PostgresCore) {
        var reply = LiveEnvelope(kind: .reply, identifier: request.identifier)
        reply.target = request.replyTo
        reply.requestID = request.requestID
        reply.failed = failed
        var inline = reply
        inline.body = bytes.base64EncodedString()
        if bytes.count <= inlineLimit, inline.notification.utf8.count <= notificationLimit {
            reply = inline
            engine.connections.submit(
                "SELECT pg_notify(\(engine.channel), \(reply.notification))",
                doing: "replying to a request"
            )
        } else {
            let id = NotificationHub.randomID()
            reply.bodyID = id
            engine.connections.submit(
                """
                WITH body AS (INSERT INTO wormhole.live_bodies (grp, id, body)
                    VALUES (\(engine.group), \(id), \(ByteBuffer(data: bytes))) RETURNING 1)
                SELECT pg_notify(\(engine.channel), \(reply.notification)) FROM body
                """,
                doing: "replying to a request"
            )
        }
    }
}
