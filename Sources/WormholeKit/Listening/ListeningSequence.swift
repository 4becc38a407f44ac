/// An observation as an `AsyncSequence`, built on its callback core: iterating it listens, and listening stops when
/// the iteration ends, the task is cancelled, or the sequence is released.
///
/// Every `AsyncSequence` of a wormhole that is not a queue's (mailbox messages, live messages, suite changes, files
/// received) is one of these. The callback is registered when the method that returns the sequence returns, before
/// iteration begins, so nothing that happens after the call is missed. The sequence ends, with nil, when its
/// listening is stopped, and with a ``WormholeError`` when its core reports one.
///
/// Iterate it once.
public struct ListeningSequence<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = WormholeError

    /// Where the callback core hands over elements.
    public struct Continuation: Sendable {
        let base: AsyncThrowingStream<Element, any Error>.Continuation

        /// Hands over an element.
        public func yield(_ element: Element) { base.yield(element) }

        /// Ends the sequence: with nil when `error` is nil, else by throwing it.
        public func finish(throwing error: WormholeError? = nil) { base.finish(throwing: error) }
    }

    /// Keeps the callback core alive while the sequence or an iterator of it lives.
    final class Core: Sendable {
        let handle: (any WormholeCancellable)?
        init(handle: (any WormholeCancellable)?) { self.handle = handle }
        deinit { handle?.cancel() }
    }

    private let stream: AsyncThrowingStream<Element, any Error>
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
        let (stream, base) = AsyncThrowingStream.makeStream(of: Element.self, bufferingPolicy: bufferingPolicy)
        self.stream = stream
        do {
            let handle = try start(Continuation(base: base))
            base.onTermination = { _ in handle.cancel() }
            core = Core(handle: handle)
        } catch {
            base.finish(throwing: error)
            core = Core(handle: nil)
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: stream.makeAsyncIterator(), core: core)
    }

    /// The iterator; it keeps the listening alive while iteration goes on.
    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: AsyncThrowingStream<Element, any Error>.AsyncIterator
        let core: Core

        /// The next element, nil when listening stopped; throws what the callback core reported.
        public mutating func next() async throws(WormholeError) -> Element? {
            do {
                return try await base.next()
            } catch let error as WormholeError {
                throw error
            } catch {
                throw WormholeError(.ioFailure, "Listening failed: \(error).", underlyingError: error)
            }
        }
    }
}

/// An iterator belongs to the task that iterates: it is not `Sendable`.
@available(*, unavailable)
extension ListeningSequence.AsyncIterator: Sendable {}
