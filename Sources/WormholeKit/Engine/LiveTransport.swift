import Foundation
import Synchronization

/// The transport of live messages and requests: to whoever listens now, nothing stored.
///
/// The wormhole encodes, decodes, checks sizes and runs callbacks where the caller asked; a transport moves bytes and
/// keeps these promises, which the live contract tests check for every engine:
///
/// - ``send(_:identifier:)`` reaches every endpoint listening for the identifier when it is called, each message once
///   and in the order sent from one sender; with no endpoint it throws ``WormholeError/Code/notReachable`` at once.
/// - ``request(_:identifier:timeout:)`` reaches one responder; it returns exactly one of the reply, a
///   ``WormholeError/Code/timedOut`` after `timeout`, ``WormholeError/Code/remoteFailure`` (the responder failed or
///   went away) or ``WormholeError/Code/notReachable`` (nobody responds) at once.
/// - Listeners of messages and responders of requests are apart: a message never reaches a responder, a request
///   never a listener.
/// - An endpoint stops when its observation is cancelled or released: senders no longer reach it.
///
/// Not yet stable: it may change in a minor release before 1.0 (see ``WormholeEngine``).
public protocol LiveTransport: Sendable {
    /// Sends `payload` to every endpoint listening for `identifier`; returns how many it reached.
    func send(_ payload: Data, identifier: String) throws(WormholeError) -> Int

    /// Calls `handler` with each message sent to `identifier`, on the transport's thread, in order per sender.
    func listen(
        identifier: String,
        handler: @escaping @Sendable (LiveMessage) -> Void
    ) throws(WormholeError) -> NotifierObservation

    /// As ``listen(identifier:handler:)``, and calls `lost` with each message that reached the endpoint but could not
    /// be handed over (on PostgreSQL, a body kept apart that was gone, or could not be read, when it came); listening
    /// goes on. The wormhole calls this one, so that a listener's error handler hears of such a loss.
    ///
    /// A transport that never loses a message it received need not implement it: the default calls
    /// ``listen(identifier:handler:)``, and never `lost`.
    func listen(
        identifier: String,
        handler: @escaping @Sendable (LiveMessage) -> Void,
        lost: @escaping @Sendable (WormholeError) -> Void
    ) throws(WormholeError) -> NotifierObservation

    /// Sends a request to one responder of `identifier` and waits for its reply.
    ///
    /// This call blocks: the wormhole calls it on a thread of its own, never on Swift's cooperative pool.
    func request(_ payload: Data, identifier: String, timeout: Duration) -> Result<Data, WormholeError>

    /// Calls `handler` with each request sent to `identifier`; the handler (or whoever it hands the request to)
    /// answers it once.
    func respond(
        identifier: String,
        handler: @escaping @Sendable (LiveRequest) -> Void
    ) throws(WormholeError) -> NotifierObservation
}

extension LiveTransport {
    /// Listens with ``listen(identifier:handler:)``: a transport that never loses a message it received.
    public func listen(
        identifier: String,
        handler: @escaping @Sendable (LiveMessage) -> Void,
        lost: @escaping @Sendable (WormholeError) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        try listen(identifier: identifier, handler: handler)
    }
}

/// A live message as a transport delivers it.
public struct LiveMessage: Sendable, Equatable {
    /// Who sent it.
    public var sender: String
    /// Its bytes.
    public var payload: Data

    /// Creates a message.
    public init(sender: String, payload: Data) {
        self.sender = sender
        self.payload = payload
    }
}

/// A request as a transport delivers it to a responder: answer it once with ``reply(_:)`` or ``fail(_:)``.
///
/// A request released without an answer fails, so that the requester is never left waiting for its time-out.
public final class LiveRequest: Sendable {
    /// Who sent it.
    public let sender: String
    /// Its bytes.
    public let payload: Data
    private let answer: Locked<(@Sendable (LiveAnswer) -> Void)?>

    /// Creates a request whose answer is handed to `answer`, once.
    ///
    /// - Parameters:
    ///   - sender: Who sent it.
    ///   - payload: Its bytes.
    ///   - answer: Called with the reply's bytes, or with the description of the responder's failure.
    public init(sender: String, payload: Data, answer: @escaping @Sendable (LiveAnswer) -> Void) {
        self.sender = sender
        self.payload = payload
        self.answer = Locked(answer)
    }

    /// Answers with a reply. Later answers are ignored.
    public func reply(_ reply: Data) { take()?(.reply(reply)) }

    /// Answers with a failure that the requester receives as ``WormholeError/Code/remoteFailure``.
    public func fail(_ description: String) { take()?(.failure(description)) }

    /// Whether the request was answered.
    public var isAnswered: Bool { answer.withLock { $0 == nil } }

    private func take() -> (@Sendable (LiveAnswer) -> Void)? {
        answer.withLock { action in
            defer { action = nil }
            return action
        }
    }

    deinit { take()?(.failure("the responder stopped before answering")) }
}

/// The answer to a ``LiveRequest``.
public enum LiveAnswer: Sendable, Equatable {
    /// The reply's bytes.
    case reply(Data)
    /// The responder failed; the description goes back to the requester.
    case failure(String)
}
