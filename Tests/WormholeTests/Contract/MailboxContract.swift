import Foundation
import Testing
import WormholeKit

/// The mailbox contract, for every engine (``Transiting`` and ``Notifier``).
///
/// A mailbox holds its newest message: passing one replaces it, reading returns it (nil when empty), clearing
/// empties it, and the identifiers listed are those of the mailboxes holding a message. Every listener of an
/// identifier, in any wormhole, is woken when a message is passed: messages passed in quick succession may be
/// coalesced to the newest, but a listener never receives an older message after a newer one, nor one message twice,
/// and it ends with the newest. `deliveringCurrentMessage` hands a new listener what is already in the mailbox first.
/// A listener stops when cancelled or when its wormhole stops listening to its identifier (listeners of other
/// wormholes go on); an `AsyncSequence` of messages then ends. Invalid identifiers are refused with
/// ``WormholeError/Code/invalidIdentifier``.
@Suite("Contract: mailboxes", .limit(minutes: 3))
struct MailboxContract {
    struct Note: Codable, Sendable, Equatable {
        var text: String
        var number: Int
    }

    @Test("The newest message is read back, identifiers are listed, clearing empties", arguments: EngineKind.underTest)
    func readBackAndClear(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app")
            let widget = try fixture.wormhole("widget")

            #expect(try widget.message(withIdentifier: "first", as: Note.self) == nil, "an empty mailbox reads nil")
            try app.passMessageObject(Note(text: "one", number: 1), identifier: "first")
            try app.passMessageObject(Note(text: "two", number: 2), identifier: "first")
            try app.passMessageObject(Note(text: "three", number: 3), identifier: "second")

            #expect(try widget.message(withIdentifier: "first", as: Note.self) == Note(text: "two", number: 2))
            #expect(try widget.message(withIdentifier: "second", as: Note.self) == Note(text: "three", number: 3))
            #expect(try widget.envelope(withIdentifier: "first")?.sender == "app")
            #expect(try widget.identifiers() == ["first", "second"])

            try widget.clearMessageContents(forIdentifier: "first")
            #expect(try app.message(withIdentifier: "first", as: Note.self) == nil)
            #expect(try app.identifiers() == ["second"])

            try app.clearAllMessageContents()
            #expect(try widget.message(withIdentifier: "second", as: Note.self) == nil)
            #expect(try widget.identifiers().isEmpty)
        }
    }

    @Test(
        "A listener in another wormhole gets rapid passes never older after newer, never twice, ending with the last",
        arguments: EngineKind.underTest
    )
    func rapidPasses(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app")
            let widget = try fixture.wormhole("widget")
            let received = Collector<Int>()
            let sequences = Collector<UInt64>()
            let listener = try widget.listenForMessage(withIdentifier: "counter", as: Int.self) { received.append($0) }
            let envelopes = try widget.listenForEnvelopes(withIdentifier: "counter") { sequences.append($0.sequence) }

            let count = 300
            var last: Envelope?
            for value in 0..<count { last = try app.passMessageObject(value, identifier: "counter") }
            let lastSequence = try #require(last).sequence

            #expect(eventually { received.values.last == count - 1 }, "ends with the last message")
            #expect(eventually { sequences.values.last == lastSequence }, "ends with the last envelope")
            let values = received.values
            #expect(!values.isEmpty)
            #expect(
                zip(values, values.dropFirst()).allSatisfy { $0 < $1 },
                "never older after newer, never twice: \(values)"
            )
            let seen = sequences.values
            #expect(zip(seen, seen.dropFirst()).allSatisfy { $0 < $1 }, "envelopes' sequences only grow: \(seen)")
            listener.cancel()
            envelopes.cancel()
        }
    }

    @Test(
        "Three listeners of one identifier, in three wormholes, all get each message",
        arguments: EngineKind.underTest
    )
    func threeListeners(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app")
            let collectors = (0..<3).map { _ in Collector<Note>() }
            let listeners = try collectors.enumerated().map { index, collector in
                try fixture.wormhole("listener-\(index)").listenForMessage(withIdentifier: "broadcast", as: Note.self) {
                    collector.append($0)
                }
            }

            try app.passMessageObject(Note(text: "hello", number: 1), identifier: "broadcast")
            #expect(eventually { collectors.allSatisfy { $0.count == 1 } })
            try app.passMessageObject(Note(text: "again", number: 2), identifier: "broadcast")
            #expect(eventually { collectors.allSatisfy { $0.count == 2 } })
            for collector in collectors {
                #expect(collector.values == [Note(text: "hello", number: 1), Note(text: "again", number: 2)])
            }
            for listener in listeners { listener.cancel() }
        }
    }

    @Test("deliveringCurrentMessage catches up on what was passed while away", arguments: EngineKind.underTest)
    func catchUp(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app")
            let widget = try fixture.wormhole("widget")

            let before = Collector<Int>()
            let first = try widget.listenForMessage(withIdentifier: "status", as: Int.self) { before.append($0) }
            try app.passMessageObject(1, identifier: "status")
            #expect(eventually { before.values == [1] })
            first.cancel()
            #expect(first.isCancelled)

            // Away: two messages are passed.
            try app.passMessageObject(2, identifier: "status")
            try app.passMessageObject(3, identifier: "status")

            let caughtUp = Collector<Int>()
            let plain = Collector<Int>()
            let catching = try fixture.wormhole("widget-again").listenForMessage(
                withIdentifier: "status",
                as: Int.self,
                deliveringCurrentMessage: true
            ) { caughtUp.append($0) }
            let notCatching = try fixture.wormhole("widget-plain").listenForMessage(
                withIdentifier: "status",
                as: Int.self
            ) {
                plain.append($0)
            }
            #expect(eventually { caughtUp.values == [3] }, "the newest message passed while away comes first")

            try app.passMessageObject(4, identifier: "status")
            #expect(eventually { caughtUp.values == [3, 4] && plain.values == [4] })
            #expect(caughtUp.values == [3, 4])
            #expect(plain.values == [4], "without deliveringCurrentMessage, only new messages")
            #expect(before.values == [1], "a cancelled listener gets nothing more")
            catching.cancel()
            notCatching.cancel()
        }
    }

    @Test(
        "messages(withIdentifier:): the current message first when asked, then each new one",
        arguments: EngineKind.underTest
    )
    func messageSequence(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let app = try fixture.wormhole("app")
        let widget = try fixture.wormhole("widget")
        try app.passMessageObject(Note(text: "waiting", number: 1), identifier: "notes")
        let current = widget.messages(withIdentifier: "notes", as: Note.self, deliveringCurrentMessage: true)
        let onlyNew = widget.messages(withIdentifier: "notes", as: Note.self)
        var currentIterator = current.makeAsyncIterator()
        #expect(try await currentIterator.next() == Note(text: "waiting", number: 1), "what was there, first")

        try app.passMessageObject(Note(text: "new", number: 2), identifier: "notes")
        #expect(try await currentIterator.next() == Note(text: "new", number: 2))
        var newIterator = onlyNew.makeAsyncIterator()
        #expect(try await newIterator.next() == Note(text: "new", number: 2), "without it, only what came after")
    }

    @Test(
        "stopListeningForMessage cancels the wormhole's listeners and ends its message sequences",
        arguments: EngineKind.underTest
    )
    func stopListening(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let app = try fixture.wormhole("app")
        let widget = try fixture.wormhole("widget")
        let other = try fixture.wormhole("other")

        let callbacks = Collector<Int>()
        let listener = try widget.listenForMessage(withIdentifier: "status", as: Int.self) { callbacks.append($0) }
        let othersReceived = Collector<Int>()
        let othersListener = try other.listenForMessage(withIdentifier: "status", as: Int.self) {
            othersReceived.append($0)
        }
        let looped = Collector<Int>()
        let sequence = widget.messages(withIdentifier: "status", as: Int.self)
        let loop = Task {
            for try await value in sequence { looped.append(value) }
            return looped.values
        }

        try app.passMessageObject(1, identifier: "status")
        #expect(await eventuallyAwaiting { looped.values == [1] && callbacks.values == [1] })
        #expect(!listener.isCancelled)

        widget.stopListeningForMessage(withIdentifier: "status")
        #expect(listener.isCancelled)
        let ended = await result(of: loop, within: 10)
        #expect(ended != nil, "the for-await loop ends once its listening is stopped")
        if let ended { #expect(try ended.get() == [1]) }

        // Another wormhole's listener goes on; the stopped ones get nothing more.
        try app.passMessageObject(2, identifier: "status")
        #expect(await eventuallyAwaiting { othersReceived.values == [1, 2] })
        #expect(callbacks.values == [1])
        othersListener.cancel()
    }

    @Test("An invalid identifier is refused with .invalidIdentifier", arguments: EngineKind.underTest)
    func invalidIdentifier(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let wormhole = try fixture.wormhole("app")
        for identifier in ["", "../escape", "a/b", ".hidden", "bell\u{7}", String(repeating: "x", count: 201)] {
            let passing = wormholeError { try wormhole.passMessageObject(1, identifier: identifier) }
            #expect(passing?.code == .invalidIdentifier, "passing to \(identifier.debugDescription)")
            let reading = wormholeError { _ = try wormhole.message(withIdentifier: identifier, as: Int.self) }
            #expect(reading?.code == .invalidIdentifier, "reading \(identifier.debugDescription)")
            let clearing = wormholeError { try wormhole.clearMessageContents(forIdentifier: identifier) }
            #expect(clearing?.code == .invalidIdentifier, "clearing \(identifier.debugDescription)")
            let listening = wormholeError {
                _ = try wormhole.listenForMessage(withIdentifier: identifier, as: Int.self) { _ in }
            }
            #expect(listening?.code == .invalidIdentifier, "listening to \(identifier.debugDescription)")
        }
        let sequenceError = await wormholeErrorAwaiting {
            for try await _ in wormhole.messages(withIdentifier: "../escape", as: Int.self) {}
        }
        #expect(sequenceError?.code == .invalidIdentifier, "the sequence ends at once")
        #expect(try wormhole.identifiers().isEmpty, "nothing was stored")
    }
}
