import Foundation
import Synchronization
import WormholeKit

/// A transiting that keeps mailboxes in memory, for tests of code that uses a wormhole.
///
/// It follows the `Transiting` contract: sequences only grow, even across deletions; identifiers are checked as
/// on disk. Pair it with ``ManualNotifier`` to control when listeners are woken:
///
/// ```swift
/// let notifier = ManualNotifier()
/// let wormhole = Wormhole(transiting: InMemoryTransiting(), notifier: notifier)
/// let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self, on: .notifierThread) { tap in
///     print("tapped", tap.number)
/// }
/// try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
/// notifier.deliverPendingNotifications()   // the listener runs now, on this thread
/// ```
///
/// Only one process sees it; it is a stand-in, not a shared store.
public final class InMemoryTransiting: Transiting {
    private struct Mailbox {
        var sequence: UInt64 = 0
        var message: Envelope?
    }
    private let mailboxes = Locked<[String: Mailbox]>([:])
    private let generation = UInt64.random(in: 1...UInt64.max)

    /// Creates an empty transiting.
    public init() {}

    public func writeMessage(_ payload: Data, sender: String, identifier: String) throws(WormholeError) -> Envelope {
        try MessageIdentifier.validate(identifier)
        return mailboxes.withLock { mailboxes in
            var mailbox = mailboxes[identifier, default: Mailbox()]
            mailbox.sequence += 1
            let envelope = Envelope(
                sequence: mailbox.sequence,
                generation: generation,
                sender: sender,
                timestampNanoseconds: Int64(Date().timeIntervalSince1970 * 1e9),
                payload: payload
            )
            mailbox.message = envelope
            mailboxes[identifier] = mailbox
            return envelope
        }
    }

    public func readMessage(identifier: String) throws(WormholeError) -> Envelope? {
        try MessageIdentifier.validate(identifier)
        return mailboxes.withLock { $0[identifier]?.message }
    }

    public func deleteMessage(identifier: String) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        mailboxes.withLock { $0[identifier]?.message = nil }
    }

    public func deleteAllMessages() throws(WormholeError) {
        mailboxes.withLock { mailboxes in
            for identifier in mailboxes.keys { mailboxes[identifier]?.message = nil }
        }
    }

    public func identifiers() throws(WormholeError) -> [String] {
        mailboxes.withLock { $0.filter { $0.value.message != nil }.keys.sorted() }
    }
}
