import Foundation
import NIOCore
import Testing
import WormholeCrashStates

@testable import WormholePostgres

/// The PostgreSQL engine's live notifications: `L` and netstrings (FORMAT-POSTGRES.md, "Notifications on PostgreSQL").
@Suite("Live envelopes on PostgreSQL notifications")
struct LiveEnvelopeTests {
    static let envelopes: [LiveEnvelope] = {
        var message = LiveEnvelope(kind: .message, identifier: "cursor")
        message.sender = "app[42]"
        message.body = Data(#"{"x":10}"#.utf8).base64EncodedString()
        var request = LiveEnvelope(kind: .request, identifier: "lookup")
        request.target = "0123456789abcdef0123456789abcdef"
        request.requestID = "r1"
        request.replyTo = "hub"
        request.sender = "écran — 🙂:12:"
        request.bodyID = "b1"
        var reply = LiveEnvelope(kind: .reply, identifier: "lookup")
        reply.target = "hub"
        reply.requestID = "r1"
        reply.failed = true
        reply.body = ""
        return [message, request, reply, LiveEnvelope(kind: .message, identifier: "")]
    }()

    @Test("The documented example reads as written, and writes back the same")
    func documentedExample() {
        let text = "L0:m6:cursor0:0:7:app[42]0b12:eyJ4IjoxMH0="
        #expect(LiveEnvelope(notification: text) == Self.envelopes[0])
        #expect(Self.envelopes[0].notification == text)
    }

    @Test("Every envelope reads back as written; peek reads the target, kind and identifier alone")
    func roundTrip() {
        for envelope in Self.envelopes {
            #expect(LiveEnvelope(notification: envelope.notification) == envelope)
            let head = LiveEnvelope.peek(envelope.notification)
            #expect(head?.target == envelope.target && head?.kind == envelope.kind)
            #expect(head?.identifier == envelope.identifier)
            // What the server builds for a request: the chosen endpoint in front of the rest.
            let built = "L\(envelope.target.utf8.count):\(envelope.target)" + envelope.notificationAfterTarget
            #expect(built == envelope.notification)
        }
    }

    @Test("Cut at any byte, with a byte changed, or with bytes added: nil or an envelope, never a crash or a misread")
    func damaged() {
        for envelope in Self.envelopes {
            let bytes = Array(envelope.notification.utf8)
            for length in 0..<bytes.count {
                #expect(LiveEnvelope(notification: String(decoding: bytes[..<length], as: UTF8.self)) == nil)
            }
            #expect(LiveEnvelope(notification: envelope.notification + "x") == nil, "trailing bytes")
            for index in bytes.indices {
                var changed = bytes
                changed[index] = changed[index] == UInt8(ascii: "9") ? UInt8(ascii: "7") : UInt8(ascii: "9")
                // A changed byte inside a text field reads as other text; a changed length or marker never reads
                // as this envelope.
                let read = LiveEnvelope(notification: String(decoding: changed, as: UTF8.self))
                #expect(read != envelope || changed == bytes)
            }
        }
        for text in ["", "L", "l{}", "L99999999:", "L-1:", "L0:z0:", "L0:m0:0:0:0:2-", "L0:m0:0:0:0:0b"] {
            #expect(LiveEnvelope(notification: text) == nil, "\(text)")
        }
    }

    @Test("Live and reply channels: PostgreSQL's 63-byte names, the group's channel first, one per identifier")
    func channels() {
        let group = "wormhole_" + String(repeating: "0123456789abcdef", count: 2)
        let identifiers = ["", "cursor", "Cursor", String(repeating: "é", count: 100), "a\"b;DROP TABLE x"]
        let names = identifiers.map { group + NotificationHub.liveSuffix(for: $0) }
        #expect(Set(names).count == identifiers.count)
        let reply = group + NotificationHub.replySuffix(NotificationHub.randomID())
        let odd = group + NotificationHub.replySuffix("not hexadecimal at all")
        for name in names + [reply, odd] {
            #expect(name.hasPrefix(group + "_") && name.utf8.count <= 63, "\(name)")
            #expect(name.utf8.allSatisfy { $0 == 0x5f || (0x30...0x39).contains($0) || (0x61...0x7a).contains($0) })
        }
        #expect(group + NotificationHub.liveSuffix(for: "cursor") == names[1], "the same identifier, the same channel")
    }
}

/// Sealed notifications: an HMAC under the group's key, and the guard against replays (FORMAT-POSTGRES.md).
@Suite("Sealed PostgreSQL notifications")
struct NotificationSealTests {
    /// The pads of the key 0, 1, …, 31 (then zeros), as `wormhole.fill_group_key` makes them.
    static let seal: NotificationSeal = {
        let key = (0..<64).map { $0 < 32 ? UInt8($0) : 0 }
        return NotificationSeal(inner: key.map { $0 ^ 0x36 }, outer: key.map { $0 ^ 0x5c })!
    }()

    @Test("HMAC-SHA256 from the pads is RFC 4231's HMAC-SHA256")
    func knownAnswer() {
        // RFC 4231, test case 2: the key "Jefe", the data "what do ya want for nothing?".
        let key = Array("Jefe".utf8) + [UInt8](repeating: 0, count: 60)
        let seal = NotificationSeal(inner: key.map { $0 ^ 0x36 }, outer: key.map { $0 ^ 0x5c })!
        let code = seal.code(of: "what do ya want for nothing?")
        let hex = code.map { String(format: "%02x", $0) }.joined()
        #expect(hex == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(NotificationSeal(inner: [1], outer: key) == nil, "pads of 64 bytes only")
    }

    @Test("A sealed notification opens to its body and origin; any change to it, or another key, does not")
    func openAndTamper() throws {
        let origin = NotificationSeal.Origin(backendPID: 4242, transaction: 987_654)
        let body = "Q7:4:jobs3:app2:10" + "4:b25l"
        let sealed = Self.seal.seal(body, origin: origin)
        let opened = try #require(Self.seal.open(sealed))
        #expect(opened.body == body[...])
        #expect(opened.origin == origin)
        // A body with a `~` of its own still opens: the last one starts the seal.
        let tilde = Self.seal.seal("L0:m3:a~b0:0:0:0-", origin: origin)
        #expect(Self.seal.open(tilde)?.body == "L0:m3:a~b0:0:0:0-")
        // Every byte changed, the origin changed, a truncation, another key: refused.
        let bytes = Array(sealed.utf8)
        for index in bytes.indices {
            var changed = bytes
            changed[index] = changed[index] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            #expect(Self.seal.open(String(decoding: changed, as: UTF8.self)) == nil, "byte \(index) changed")
        }
        let otherPID = sealed.replacingOccurrences(of: "~4242:", with: "~4243:")
        #expect(Self.seal.open(otherPID) == nil)
        #expect(Self.seal.open(String(sealed.dropLast(4))) == nil)
        #expect(Self.seal.open(body) == nil, "unsealed")
        let key = [UInt8](repeating: 7, count: 64)
        let other = NotificationSeal(inner: key.map { $0 ^ 0x36 }, outer: key.map { $0 ^ 0x5c })!
        #expect(other.open(sealed) == nil)
    }

    @Test("Random bytes and random changes of sealed notifications and snapshots: no crash, nothing opens but the seal")
    func randomInput() {
        var generator = SplitMix64(seed: 0x5eed)  // a seed, so that a failing case comes back the same
        let origin = NotificationSeal.Origin(backendPID: 77, transaction: 1 << 40)
        let sealed = Self.seal.seal("L0:m5:ticks0:0:3:app0b4:MQ==", origin: origin)
        let alphabet = Array("~:0123456789-+/=ABCabcLQ\u{0}é".utf8)
        for _ in 0..<20_000 {
            var bytes = Array(sealed.utf8)
            for _ in 0..<Int.random(in: 1...4, using: &generator) {
                let index = Int.random(in: 0..<bytes.count, using: &generator)
                switch Int.random(in: 0..<3, using: &generator) {
                case 0: bytes[index] = alphabet.randomElement(using: &generator)!
                case 1: bytes.remove(at: index)
                default: bytes.insert(alphabet.randomElement(using: &generator)!, at: index)
                }
                if bytes.isEmpty { bytes = [UInt8(ascii: "~")] }
            }
            let text = String(decoding: bytes, as: UTF8.self)
            if let opened = Self.seal.open(text) {
                #expect(text == sealed, "a changed notification opened: \(text.debugDescription)")
                #expect(opened.origin == origin)
            }
            let snapshot = String(decoding: bytes.prefix(24), as: UTF8.self)
            _ = ReplayGuard(snapshot: snapshot)
        }
    }

    @Test("The replay guard: transactions over before LISTEN, another backend, an older or repeated one are refused")
    func replayGuard() throws {
        // xmin 100, xmax 110, transactions 103 and 105 in progress.
        var guardian = try #require(ReplayGuard(snapshot: "100:110:103,105"))
        func origin(_ pid: Int32, _ xid: UInt64) -> NotificationSeal.Origin {
            NotificationSeal.Origin(backendPID: pid, transaction: xid)
        }
        func admit(_ origin: NotificationSeal.Origin, code: Substring, sentBy sender: Int32) -> Bool {
            guardian.admit(origin, code: code, sentBy: sender)
        }
        #expect(!admit(origin(1, 104), code: "a", sentBy: 1), "over before the snapshot")
        #expect(!admit(origin(1, 99), code: "a", sentBy: 1), "before xmin")
        #expect(admit(origin(1, 103), code: "a", sentBy: 1), "in progress at the snapshot")
        #expect(admit(origin(2, 110), code: "b", sentBy: 2), "begun after it")
        #expect(!admit(origin(2, 111), code: "c", sentBy: 3), "sent by another backend than it names")
        #expect(!admit(origin(2, 110), code: "b", sentBy: 2), "the same one again")
        #expect(admit(origin(2, 110), code: "b2", sentBy: 2), "another of the same transaction")
        #expect(admit(origin(2, 120), code: "d", sentBy: 2))
        #expect(!admit(origin(2, 115), code: "e", sentBy: 2), "older than the last from that backend")
        #expect(admit(origin(1, 105), code: "f", sentBy: 1), "another backend's order is its own")
        for text in ["", "1:2", "a:2:", "1:b:", "1:2:x", "1:2:3,,4"] {
            #expect(ReplayGuard(snapshot: text) == nil, "\(text)")
        }
        #expect(ReplayGuard(snapshot: "5:5:") != nil)
    }
}

/// The records an append notification carries: `Q`, the first offset, `:`, then netstrings (FORMAT-POSTGRES.md).
@Suite("Queue appends carried by PostgreSQL notifications")
struct CarriedAppendTests {
    @Test("An append reads back as written, records and all; one too large is not carried")
    func roundTrip() throws {
        let payloads = [Data("one".utf8), Data(), Data([0, 255, 10])]
        let carried = try #require(
            CarriedAppend.carried(
                identifier: "jobs.é",
                sender: "app[1]:2",
                time: -5,
                payloads: payloads.map { ByteBuffer(data: $0) }
            )
        )
        let notification = "Q41:" + carried
        let append = try #require(CarriedAppend(notification: notification))
        #expect(append.notification == notification)
        #expect(CarriedAppend.identifier(of: notification) == "jobs.é")
        #expect(append.records.map(\.offset) == [41, 42, 43])
        #expect(append.records.map(\.end) == [42, 43, 44])
        #expect(append.records.map(\.payload) == payloads)
        #expect(append.records.allSatisfy { $0.sender == "app[1]:2" && $0.timestampNanoseconds == -5 })
        let large = [ByteBuffer(data: Data(repeating: 1, count: 5_000))]
        #expect(CarriedAppend.carried(identifier: "jobs", sender: "s", time: 0, payloads: large) == nil)
    }

    @Test("Cut at any byte or with bytes added: nil, never a crash or other records")
    func damaged() throws {
        let notification =
            "Q7:" + CarriedAppend.carried(
                identifier: "q",
                sender: "s",
                time: 1,
                payloads: [
                    ByteBuffer(data: Data("payload".utf8))
                ]
            )!
        let bytes = Array(notification.utf8)
        for length in 0..<bytes.count {
            #expect(CarriedAppend(notification: String(decoding: bytes[..<length], as: UTF8.self)) == nil)
        }
        #expect(CarriedAppend(notification: notification + "1") == nil)
        for text in ["", "Q", "Q:", "Qx:1:q1:s1:11:A", "Q1:1:q1:s1:x4:AAAA", "Q1:1:q1:s1:1", "n queue.q"] {
            #expect(CarriedAppend(notification: text) == nil, "\(text)")
        }
    }
}
