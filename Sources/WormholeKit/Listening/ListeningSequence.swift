/// An observation as an `AsyncSequence`, built on its callback core: iterating it listens, and listening stops when
/// the iteration ends, the task is cancelled, or the sequence is released.
///
/// Every `AsyncSequence` of a wormhole that is not a queue's (mailbox messages, live messages, suite changes, files
/// received) is one of these. The callback is registered when the method that returns the sequence returns, before
/// iteration begins, so nothing that happens after the call is missed. The sequence ends, with nil, when its
/// listening is stopped, and with a ``WormholeError`` when its core reports one.
///
/// Iterate it once, in one task: a second task that asks for an element while the first waits for one traps.
public struct ListeningSequence<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = WormholeError

    /// Where the callback core hands over elements.
    public struct Continuation: Sendable {
        @usableFromInline
        let channel: ListeningChannel<Element>

        /// Hands over an element.
        @inlinable
        public func yield(_ element: Element) { channel.yield(element) }

        /// Ends the sequence: with nil when `error` is nil, else by throwing it.
        @inlinable
        public func finish(throwing error: WormholeError? = nil) { channel.finish(throwing: error) }
    }

    /// Keeps the callback core alive while the sequence or an iterator of it lives.
    final class Core: Sendable {
        let handle: (any WormholeCancellable)?
        init(handle: (any WormholeCancellable)?) { self.handle = handle }
        deinit { handle?.cancel() }
    }

    let channel: ListeningChannel<Element>
    private let core: Core

    /// Starts listening through `start`, which registers a callback that hands elements to the continuation.
    ///
    /// - Parameters:
    ///   - bufferingPolicy: What to keep when the consumer falls behind; everything by default.
    ///   - start: Registers the callback core and returns its handle; an error it throws ends the sequence at once.
    public init(
        bufferingPolicy: AsyncThrowingStream<Element, any Error>.Continuation.BufferingPolicy = .unbounded,
        start: (Continuation) throws(WormholeError) -> any WormholeCancellable
    ) {
        let channel = ListeningChannel<Element>(policy: bufferingPolicy)
        self.channel = channel
        do {
            let handle = try start(Continuation(channel: channel))
            channel.setOnTermination { handle.cancel() }
            core = Core(handle: handle)
        } catch {
            channel.finish(throwing: error)
            core = Core(handle: nil)
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(channel: channel, core: core)
    }

    /// The iterator; it keeps the listening alive while iteration goes on.
    public struct AsyncIterator: AsyncIteratorProtocol {
        @usableFromInline
        let channel: ListeningChannel<Element>
        let core: Core

        /// The next element, nil when listening stopped; throws what the callback core reported.
        @inlinable
        public mutating func next() async throws(WormholeError) -> Element? {
            try await channel.next()
        }
    }
}

/// An iterator belongs to the task that iterates: it is not `Sendable`.
@available(*, unavailable)
extension ListeningSequence.AsyncIterator: Sendable {}
