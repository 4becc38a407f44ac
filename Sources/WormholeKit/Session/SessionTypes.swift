import Foundation

/// Where a ``WormholeSession`` is in its life, as `WCSessionActivationState`.
public enum SessionActivationState: String, Sendable, Codable, Hashable, CustomStringConvertible {
    /// Not activated yet, or deactivated: nothing is received, and sending throws
    /// ``WormholeError/Code/notActivated``.
    case notActivated
    /// Between activated and not activated: the session is stopping, and takes nothing new.
    case inactive
    /// Activated: the session receives, and may send.
    case activated

    public var description: String { rawValue }
}

/// A new application context from the counterpart, with the keys whose values changed since the last one this
/// side received.
public struct SessionContextUpdate: Sendable, Equatable {
    /// The whole context, as the counterpart last set it.
    public var context: [String: JSONValue]
    /// The keys whose values differ from the context received before (added, changed or removed).
    public var changedKeys: Set<String>
    /// The counterpart's sender name (its wormhole's ``Wormhole/sender``).
    public var sender: String
    /// When the counterpart set it.
    public var date: Date

    /// Creates an update.
    public init(context: [String: JSONValue], changedKeys: Set<String>, sender: String, date: Date) {
        self.context = context
        self.changedKeys = changedKeys
        self.sender = sender
        self.date = date
    }
}

/// A message from the counterpart, as `session(_:didReceiveMessage:replyHandler:)` gets it.
///
/// When the counterpart waits for a reply (``expectsReply``), answer once with ``reply(_:)`` or ``fail(_:)``, now or
/// later; a message released unanswered fails, so the counterpart is never left waiting for its time-out. When it
/// does not, the session answers for you once every handler has returned.
public final class SessionMessage: Sendable {
    /// The message.
    public let message: [String: JSONValue]
    /// The counterpart's sender name.
    public let sender: String
    /// Whether the counterpart waits for a reply.
    public let expectsReply: Bool
    let request: LiveRequest

    init(message: [String: JSONValue], sender: String, expectsReply: Bool, request: LiveRequest) {
        self.message = message
        self.sender = sender
        self.expectsReply = expectsReply
        self.request = request
    }

    /// Creates a message whose answer goes to `answer`, once: to test a message handler of yours.
    ///
    /// - Parameters:
    ///   - message: The message.
    ///   - sender: The sender's name.
    ///   - expectsReply: Whether a reply is expected.
    ///   - answer: Called with the reply as JSON bytes, or the failure's description; with a failure when the
    ///     message is released unanswered.
    public convenience init(
        message: [String: JSONValue],
        sender: String,
        expectsReply: Bool,
        answer: @escaping @Sendable (LiveAnswer) -> Void
    ) {
        self.init(
            message: message,
            sender: sender,
            expectsReply: expectsReply,
            request: LiveRequest(sender: sender, payload: Data(), answer: answer)
        )
    }

    /// Replies; later answers are ignored.
    public func reply(_ reply: [String: JSONValue]) {
        do {
            request.reply(try JSONMessageCoder().encode(reply))
        } catch {
            request.fail("the reply could not be encoded: \(error)")
        }
    }

    /// Fails the message: the counterpart's send throws ``WormholeError/Code/remoteFailure`` with `description`.
    public func fail(_ description: String) { request.fail(description) }

    /// Whether it was answered.
    public var isAnswered: Bool { request.isAnswered }
}

/// A user info transfer: a dictionary queued for the counterpart, delivered in order and once
/// (`WCSessionUserInfoTransfer`).
public struct SessionUserInfoTransfer: Sendable, Equatable, Codable, Identifiable {
    /// The transfer's id, for ``WormholeSession/cancelUserInfoTransfer(_:)``.
    public var id: String
    /// The dictionary.
    public var userInfo: [String: JSONValue]
    /// Whether it was sent with ``WormholeSession/transferCurrentComplicationUserInfo(_:)``.
    public var isCurrentComplicationInfo: Bool
    /// The sender's name.
    public var sender: String
    /// When it was queued, in nanoseconds since 1970.
    public var queuedNanoseconds: Int64

    /// When it was queued.
    public var date: Date { Date(timeIntervalSince1970: Double(queuedNanoseconds) / 1e9) }

    /// Creates a transfer record.
    public init(
        id: String,
        userInfo: [String: JSONValue],
        isCurrentComplicationInfo: Bool,
        sender: String,
        queuedNanoseconds: Int64
    ) {
        self.id = id
        self.userInfo = userInfo
        self.isCurrentComplicationInfo = isCurrentComplicationInfo
        self.sender = sender
        self.queuedNanoseconds = queuedNanoseconds
    }
}

// MARK: What the session stores (FORMAT.md, "Sessions")

/// The application context as the sender stores it in its mailbox.
struct SessionContextRecord: Codable, Sendable {
    /// A new id for each update, so that a receiver knows whether it has seen this one.
    var id: String
    var context: [String: JSONValue]
    var sender: String
    var nanoseconds: Int64
}

/// The last context a receiver handed to its handlers, kept so that an update after an absence reports the keys
/// that changed meanwhile.
struct SessionReceivedContext: Codable, Sendable {
    var id: String
    var context: [String: JSONValue]
}

/// What a session's presence mailbox says of it.
struct SessionPresence: Codable, Sendable {
    var state: SessionActivationState
    var sender: String
    var nanoseconds: Int64
}

/// A message on the wire.
struct SessionWireMessage: Codable, Sendable {
    var message: [String: JSONValue]
    var expectsReply: Bool
}

/// A user info transfer in its sender's outbox.
struct SessionOutboxEntry: Codable, Sendable {
    enum State: String, Codable, Sendable {
        /// Not taken by the receiver yet: it may be cancelled.
        case queued
        /// Taken by the receiver, whose handlers are under way: too late to cancel; it comes again if the receiver
        /// dies before it is done.
        case delivering
    }
    var transfer: SessionUserInfoTransfer
    var state: State
}

extension [String: JSONValue] {
    /// The keys whose values differ between the two.
    func changedKeys(comparedTo other: [String: JSONValue]) -> Set<String> {
        Set(keys).union(other.keys).filter { self[$0] != other[$0] }
    }
}
