import Foundation
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
}
