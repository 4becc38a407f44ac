import Foundation
import NIOCore
import Testing

@testable import WormholePostgres

/// The PostgreSQL engine's live notifications: `L` and netstrings (FORMAT.md, "Notifications on PostgreSQL").
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
        let names = identifiers.map { NotificationHub.liveChannel(group, $0) }
        #expect(Set(names).count == identifiers.count)
        let reply = NotificationHub.replyChannel(group, NotificationHub.randomID())
        let odd = NotificationHub.replyChannel(group, "not hexadecimal at all")
        for name in names + [reply, odd] {
            #expect(name.hasPrefix(group + "_") && name.utf8.count <= 63, "\(name)")
            #expect(name.utf8.allSatisfy { $0 == 0x5f || (0x30...0x39).contains($0) || (0x61...0x7a).contains($0) })
        }
        #expect(NotificationHub.liveChannel(group, "cursor") == names[1], "the same identifier, the same channel")
    }
}

/// The records an append notification carries: `Q`, the first offset, `:`, then netstrings (FORMAT.md).
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
