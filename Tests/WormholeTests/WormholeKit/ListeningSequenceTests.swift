import Foundation
import Testing

@testable import WormholeKit

/// `ListeningSequence`, the `AsyncSequence` of every mailbox, live, suite and transfer listener, on its own: what it
/// buffers, how it ends, and that a waiting task gets every element.
@Suite("A ListeningSequence hands its callback's elements to the task that iterates", .timeLimit(.minutes(1)))
struct ListeningSequenceTests {
    /// A callback core's handle, which records that it was cancelled.
    final class Handle: WormholeCancellable {
        private let cancelled = Locked(false)
        func cancel() { cancelled.withLock { $0 = true } }
        var isCancelled: Bool { cancelled.withLock { $0 } }
    }

    /// A sequence, the continuation its start was given, and the handle its start returned.
    static func make(
        _ policy: AsyncThrowingStream<Int, any Error>.Continuation.BufferingPolicy = .unbounded
    ) -> (ListeningSequence<Int>, ListeningSequence<Int>.Continuation, Handle) {
        let handle = Handle()
        let given = Locked<ListeningSequence<Int>.Continuation?>(nil)
        let sequence = ListeningSequence<Int>(bufferingPolicy: policy) { continuation in
            given.withLock { $0 = continuation }
            return handle
        }
        return (sequence, given.withLock { $0! }, handle)
    }

    static func collect(_ sequence: ListeningSequence<Int>) async throws -> [Int] {
        var elements: [Int] = []
        for try await element in sequence { elements.append(element) }
        return elements
    }

    enum Policy: String, CaseIterable {
        case unbounded, newestTwo, oldestTwo

        var policy: AsyncThrowingStream<Int, any Error>.Continuation.BufferingPolicy {
            switch self {
            case .unbounded: .unbounded
            case .newestTwo: .bufferingNewest(2)
            case .oldestTwo: .bufferingOldest(2)
            }
        }

        var kept: [Int] {
            switch self {
            case .unbounded: [1, 2, 3, 4, 5]
            case .newestTwo: [4, 5]
            case .oldestTwo: [1, 2]
            }
        }
    }

    @Test("Elements yielded before iteration are kept as the buffering policy says", arguments: Policy.allCases)
    func buffering(_ policy: Policy) async throws {
        let (sequence, continuation, handle) = Self.make(policy.policy)
        for element in 1...5 { continuation.yield(element) }
        continuation.finish()
        #expect(handle.isCancelled, "finishing ends the callback core")
        #expect(try await Self.collect(sequence) == policy.kept)
    }

    @Test("The end comes after the buffered elements: its error once, then nil; later yields are dropped")
    func endAfterBuffered() async throws {
        let (sequence, continuation, handle) = Self.make()
        continuation.yield(1)
        continuation.yield(2)
        continuation.finish(throwing: WormholeError(.corruptMessage, "bad"))
        continuation.yield(3)
        continuation.finish()
        #expect(handle.isCancelled)
        var iterator = sequence.makeAsyncIterator()
        #expect(try await iterator.next() == 1)
        #expect(try await iterator.next() == 2)
        do {
            _ = try await iterator.next()
            Issue.record("the end was not thrown")
        } catch {
            #expect(error.code == .corruptMessage)
        }
        #expect(try await iterator.next() == nil)
        #expect(try await iterator.next() == nil)
    }

    @Test("A task waiting for elements gets every one yielded from another thread, in order")
    func waitingTaskGetsEverything() async throws {
        let (sequence, continuation, _) = Self.make()
        let count = 20_000
        let received = try await withTimeLimit(seconds: 30) {
            let reader = Task { try await Self.collect(sequence) }
            let thread = Thread {
                for element in 0..<count {
                    continuation.yield(element)
                    // Now and then the reader catches up and waits, so both paths (buffered, waiting) are taken.
                    if element % 1_000 == 0 { usleep(1_000) }
                }
                continuation.finish()
            }
            thread.start()
            return try await reader.value
        }
        #expect(received == Array(0..<count))
    }

    @Test("Keeping the newest one, a reader that falls behind gets newer elements only, and the last one")
    func newestOneUnderLoad() async throws {
        let (sequence, continuation, _) = Self.make(.bufferingNewest(1))
        let count = 20_000
        let received = try await withTimeLimit(seconds: 30) {
            let reader = Task { try await Self.collect(sequence) }
            let thread = Thread {
                for element in 0..<count { continuation.yield(element) }
                continuation.finish()
            }
            thread.start()
            return try await reader.value
        }
        #expect(received.last == count - 1)
        #expect(zip(received, received.dropFirst()).allSatisfy { $0 < $1 })
    }

    @Test("Cancelling the waiting task ends the iteration with nil and cancels the callback core")
    func cancellingTheWaitingTask() async throws {
        let (sequence, continuation, handle) = Self.make()
        let first = Locked(false)
        let reader = Task { () -> [Int] in
            var elements: [Int] = []
            for try await element in sequence {
                elements.append(element)
                first.withLock { $0 = true }
            }
            return elements
        }
        continuation.yield(7)
        #expect(eventually { first.withLock { $0 } })
        // The reader now waits for the next element: cancelling it wakes it.
        reader.cancel()
        let elements = try await withTimeLimit(seconds: 10) { try await reader.value }
        #expect(elements == [7])
        #expect(handle.isCancelled)
        continuation.yield(8)  // dropped, not kept nor crashing
    }

    @Test("A task cancelled before it iterates takes what is buffered, then ends")
    func cancelledBeforeIterating() async throws {
        let (sequence, continuation, handle) = Self.make()
        continuation.yield(1)
        let reader = Task { () -> [Int] in
            withUnsafeCurrentTask { $0?.cancel() }
            return try await Self.collect(sequence)
        }
        let elements = try await withTimeLimit(seconds: 10) { try await reader.value }
        #expect(elements == [1])
        #expect(handle.isCancelled)
    }

    @Test("A start that throws ends the sequence with its error; releasing a sequence stops its callback core")
    func startFailsAndRelease() async throws {
        let failing = ListeningSequence<Int> { (_) throws(WormholeError) in
            throw WormholeError(.invalidIdentifier, "no such identifier")
        }
        var iterator = failing.makeAsyncIterator()
        do {
            _ = try await iterator.next()
            Issue.record("the start's error was not thrown")
        } catch {
            #expect(error.code == .invalidIdentifier)
        }
        #expect(try await iterator.next() == nil)

        let handle = Handle()
        do {
            let released = ListeningSequence<Int> { _ in handle }
            _ = released
        }
        #expect(handle.isCancelled)
    }
}
